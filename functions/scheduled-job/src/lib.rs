//! `scheduled-job`: each scheduled occurrence runs on exactly one deployment.
//! The logic is in `leasegate_functions::jobs`; these are the Spin entry points: the HTTP
//! trigger (an HTTP scheduler's ticks, the reservation log, Azure Functions timer invocations)
//! and Spin's cron trigger (`handle-cron-event`).

leasegate_functions::http_export!(
    leasegate_functions::jobs::handle_http,
    leasegate_functions::jobs::MAX_BODY_BYTES
);
leasegate_functions::cron_export!(leasegate_functions::jobs::handle_cron);
