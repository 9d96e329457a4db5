//! `leader`: one leader among the instances of a worker, elected by lease renewal.
//! The logic is in `leasegate_functions::leader`; these are the Spin entry points: the HTTP
//! trigger (`/api/leader`, Azure Functions timer invocations) and Spin's cron trigger.

leasegate_functions::http_export!(
    leasegate_functions::leader::handle_http,
    leasegate_functions::leader::MAX_BODY_BYTES
);
leasegate_functions::cron_export!(leasegate_functions::leader::handle_cron);
