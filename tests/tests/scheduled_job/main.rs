//! scheduled-job, as the release `.wasm` under the real `spin up` (and Spin's cron trigger),
//! against Azurite: each occurrence run once across deployments, its triggers, schedules and
//! zones, retries, takeovers, lost answers, history, pause and backfill, a table of many jobs.
//!
//! One binary: `cargo test -p leasegate-tests --test scheduled_job`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod abandoned_wasm;
mod control_wasm;
mod dst_wasm;
mod due_wasm;
mod extremes_wasm;
mod fleet_wasm;
mod history_wasm;
mod lost_answers_wasm;
mod once_wasm;
mod requests_wasm;
mod retries_wasm;
mod schedule_wasm;
mod table_wasm;
mod takeover_wasm;
mod triggers_wasm;
