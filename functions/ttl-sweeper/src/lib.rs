//! `ttl-sweeper`: blobs past their time-to-live are deleted (or moved) exactly once by several
//! workers. The logic is in `leasegate_functions::ttl`; these are the Spin entry points: the
//! HTTP trigger (`/api/ttl/...` marking, `/api/sweeper/...`, Azure Functions timer invocations)
//! and Spin's cron trigger.

leasegate_functions::http_export!(
    leasegate_functions::ttl::handle_http,
    leasegate_functions::ttl::MAX_BODY_BYTES
);
leasegate_functions::cron_export!(leasegate_functions::ttl::handle_cron);
