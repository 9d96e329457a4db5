//! `init-once`: a setup step runs once across every deployment.
//! The logic is in `leasegate_functions::init`; these are the Spin entry points: the HTTP
//! trigger (`/api/init/{name}`, Azure Functions timer invocations) and Spin's cron trigger.

leasegate_functions::http_export!(
    leasegate_functions::init::handle_http,
    leasegate_functions::init::MAX_BODY_BYTES
);
leasegate_functions::cron_export!(leasegate_functions::init::handle_cron);
