//! `POST|GET|DELETE /api/gate/{key}`: the generic gate API.
//! The logic is in `leasegate_functions::gate`; this is the Spin entry point.

/// Gate requests carry no meaningful body; anything larger than this is refused.
const MAX_BODY_BYTES: usize = 64 * 1024;

leasegate_functions::http_export!(leasegate_functions::gate::handle, MAX_BODY_BYTES);
