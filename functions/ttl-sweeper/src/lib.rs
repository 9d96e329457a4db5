//! `ttl-sweeper`: blobs marked with a time-to-live (metadata `TimeToLive`, and optionally
//! `DeadBlobContainer`) are deleted, or moved to a dead-blob container first, exactly once, by
//! several workers sweeping at the same time; the app's own lock blobs free for longer than
//! `ttl_lock_retention_seconds` are deleted too. A tick claims a page of the listing by a
//! compare-and-swap of the sweep state and processes the page, until its time budget is spent
//! (a tick with nothing to do, the pass complete and the next not due, only reads the state);
//! `PUT /api/ttl/{container}/{blob}` marks a blob, `DELETE` unmarks it. What it does,
//! guarantees and costs: `docs/ttl-sweeper.md`.
//!
//! The modules: `settings` (the variables), `state` (the state blob's schema), `claim`
//! (claiming a page by a compare-and-swap of the state: listed, or found by the expiry tag),
//! `sweep` (a tick, and what becomes of each listed blob), `found` (what becomes of each blob
//! found by its expiry tag), `mark` and `unmark` (the marking API: metadata and the expiry
//! tag), `index` (the expiry tag), `migrate` (tagging blobs marked the old way), `answer`
//! (what a tick answers and logs).
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

mod answer;
mod claim;
mod error;
mod found;
mod index;
mod mark;
mod migrate;
mod settings;
mod state;
mod sweep;
mod unmark;

pub use answer::TickAnswer;
pub use settings::Settings;

use std::time::Instant;

use leasegate::{Counting, Request, Response, StatusCode, Transport};

use leasegate_spin::auth::Power;
use leasegate_spin::config::{ConfigError, Variables};
use leasegate_spin::timer::{Source, Tick, TimerFunction};
use leasegate_spin::web;
use leasegate_spin::{auth, Context};

use answer::describe;
use mark::mark;
use state::read_state;
use sweep::sweep;
use unmark::unmark;

/// `ttl_lock_retention_seconds` when it is not set: a day.
pub const DEFAULT_LOCK_RETENTION_SECS: u64 = 86_400;

/// Metadata name of the time-to-live (as storage keeps it: lowercase).
pub const TIME_TO_LIVE: &str = "timetolive";
/// Metadata name of the dead-blob container.
pub const DEAD_BLOB_CONTAINER: &str = "deadblobcontainer";
/// The index tag marking writes beside `TimeToLive`: the same instant, RFC 3339 UTC to the
/// second (`2026-11-21T14:00:00Z`, fixed width, so it sorts as a string: tag queries compare
/// strings). An underscore, not a hyphen: Azurite 3.35's tag query parser refuses `-` in a key
/// (Azure accepts it).
pub const EXPIRES_TAG: &str = "leasegate_expires_at";
/// The migration's progress blob (`POST /api/sweeper/migrate`).
pub const MIGRATION_BLOB: &str = "sweeper/migration.json";
/// The sweep state blob.
pub const STATE_BLOB: &str = "sweeper/state.json";
/// The longest time-to-live the marking API accepts (10 years).
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

/// The largest request body the routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Route prefix of the marking API.
pub const TTL_ROUTE: &str = "/api/ttl/";
/// Route of the sweeper's HTTP forms.
pub const SWEEPER_ROUTE: &str = "/api/sweeper";

/// The TTL sweeper as a timer function: a pass ticked by Spin's cron trigger, an Azure Functions
/// timer, or `POST /api/sweeper/tick`; blobs marked by `PUT /api/ttl/{container}/{blob}`.
pub struct Sweeper;

impl TimerFunction for Sweeper {
    const NAME: &'static str = "ttl-sweeper";
    const ROUTES: &'static [&'static str] = &["/api/ttl", SWEEPER_ROUTE];
    type Settings = Settings;
    type Answer = TickAnswer;

    fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Settings::load(vars)
    }

    /// One pass of the sweep: `Err` to the cron trigger when the sweep state could not be
    /// used.
    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Settings,
        tick: &Tick,
        started: Instant,
    ) -> (StatusCode, TickAnswer) {
        let (report, failure, trips) = sweep(ctx, settings, started).await;
        describe(
            settings,
            tick.source,
            report,
            failure.as_ref(),
            trips,
            started,
        )
    }

    fn failure(answer: &TickAnswer) -> String {
        answer
            .message
            .clone()
            .unwrap_or_else(|| "the sweep failed".to_string())
    }

    fn summary(settings: &Settings, answer: &TickAnswer) -> String {
        let report = &answer.report;
        format!(
            "ttl-sweeper on {}: {} pages, {} deleted, {} moved",
            settings.instance_id, report.pages, report.deleted, report.moved
        )
    }

    /// `PUT` and `DELETE /api/ttl/{container}/{blob}` (marking and unmarking: bearer
    /// `admin_token` only), `POST
    /// /api/sweeper/migrate` (tagging blobs marked the old way: `admin_token` only), `POST
    /// /api/sweeper/tick` and `GET /api/sweeper` (the state: bearer `timer_token` or
    /// `admin_token`).
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        power: Power,
        started: Instant,
    ) -> Response {
        let path = request.path();
        if path.starts_with(TTL_ROUTE)
            || path.trim_end_matches('/') == TTL_ROUTE.trim_end_matches('/')
        {
            let unmarking = request.method() == leasegate::Method::DELETE;
            let what = if unmarking {
                "unmarking a blob"
            } else {
                "marking a blob"
            };
            if let Err(r) = auth::require_admin(ctx.variables, power, what) {
                return r;
            }
            return match *request.method() {
                leasegate::Method::PUT => mark(ctx, request).await,
                leasegate::Method::DELETE => unmark(ctx, request).await,
                _ => web::method_not_allowed("PUT, DELETE"),
            };
        }
        let action = path[SWEEPER_ROUTE.len()..].trim_matches('/');
        let method = request.method().clone();
        match (action, &method) {
            ("", &leasegate::Method::GET)
            | ("tick", &leasegate::Method::POST)
            | ("migrate", &leasegate::Method::POST) => {}
            ("", _) => return web::method_not_allowed("GET"),
            ("tick" | "migrate", _) => return web::method_not_allowed("POST"),
            _ => return web::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "routes: GET /api/sweeper, POST /api/sweeper/tick, POST /api/sweeper/migrate, PUT and DELETE /api/ttl/{container}/{blob}",
            ),
        }
        if action == "migrate" {
            if let Err(r) =
                auth::require_admin(ctx.variables, power, "tagging the blobs marked the old way")
            {
                return r;
            }
        }
        if !request.body().iter().all(u8::is_ascii_whitespace) {
            return web::error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "this route takes no body",
            );
        }
        let settings = match Settings::load(ctx.variables) {
            Ok(s) => s,
            Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
        };
        if action == "migrate" {
            return migrate::migrate(ctx, &settings, started).await;
        }
        if method == leasegate::Method::GET {
            let transport = (ctx.connect)(settings.storage.timeout);
            // Counted like the other paths: one instance of the storage code per component.
            let transport = Counting::new(&transport);
            let blobs = settings.storage.blobs(&transport);
            return match read_state(&blobs, &settings, ctx.now).await {
                Ok(read) => web::json(StatusCode::OK, &read.state),
                Err(e) => e.answer(),
            };
        }
        let tick = Tick {
            at: ctx.now,
            source: Source::Http,
            past_due: false,
        };
        let (status, answer) = Self::tick(ctx, &settings, &tick, started).await;
        Self::log(&answer);
        web::json(status, &answer)
    }
}

// The Spin entry points: the HTTP component (the routes and the Azure channel) and the cron
// trigger's export, both serving [`Sweeper`].
leasegate_spin::timer_export!(crate::Sweeper, MAX_BODY_BYTES);
