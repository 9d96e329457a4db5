//! `POST /api/telemetry`: device alerts, at most one per device per window.
//! The logic is in `leasegate_functions::telemetry`; this is the Spin entry point.

leasegate_functions::http_export!(
    leasegate_functions::telemetry::handle,
    leasegate_functions::telemetry::MAX_BODY_BYTES
);
