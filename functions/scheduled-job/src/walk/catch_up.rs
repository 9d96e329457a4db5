//! Catching up: running a missed occurrence nobody reserved (`job_catch_up = all`), and a
//! buffered one once the lease is free.

use super::*;

/// What became of a buffered occurrence [`run_existing`] looked at.
pub(super) enum Existing {
    /// Run: its entry.
    Ran(LogEntry),
    /// Not now (the lease busy, storage failed).
    NotNow,
    /// Its reservation is gone (`None`) or has this outcome: not buffered any more.
    Other(Option<RunStatus>),
}

/// Runs a buffered occurrence (`pending`) if the takeover rule lets this tick, `pastDue`.
pub(super) async fn run_existing<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
) -> Existing {
    let Ok(blob) = settings.reservation(occurrence) else {
        return Existing::NotNow;
    };
    let Ok((props, date)) = head(blobs, &blob, ctx.now).await else {
        return Existing::NotNow;
    };
    let Some(props) = props else {
        return Existing::Other(None);
    };
    let outcome = outcome_of(&props.metadata);
    if outcome != Some(RunStatus::Pending) {
        return Existing::Other(outcome);
    }
    let server_now = date.unwrap_or(ctx.now);
    let Takeover::Run { attempt } = takeover(&props, server_now, settings, false) else {
        return Existing::NotNow;
    };
    let reservation = Reservation {
        blob,
        etag: props.etag.clone(),
        metadata: props.metadata.clone(),
        created: false,
    };
    let this = Tick {
        at: at(occurrence),
        source: tick.source,
        past_due: true,
    };
    let run = ReservedRun {
        occurrence,
        reserved_at: props.last_modified.unwrap_or(server_now),
        server_now,
        reservation,
        skip_late: false,
        attempt,
    };
    let ran = run_reserved(ctx, blobs, job, settings, &this, run).await;
    match ran {
        Ok((Decision::Ran { entry } | Decision::JobFailed { entry }, _)) => Existing::Ran(entry),
        _ => Existing::NotNow,
    }
}

/// Runs one missed occurrence nobody reserved (`job_catch_up = all`): reserves it, then the
/// steps of any run, `pastDue`. `None`: another tick reserved it meanwhile, or storage failed
/// (a later winner looks again).
pub(crate) async fn catch_up_one<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
) -> Option<LogEntry> {
    let nonce = (ctx.new_lease_id)().to_string();
    let by = Reserving {
        trigger: tick.source.as_str(),
        late: true,
        nonce: &nonce,
    };
    let reserved = reserve(blobs, settings, occurrence, &by, ctx.now);
    let Reserved::Created(reservation, t) = reserved.await.ok()? else {
        return None;
    };
    let this = Tick {
        at: at(occurrence),
        source: tick.source,
        past_due: true,
    };
    let run = ReservedRun {
        occurrence,
        reserved_at: t,
        server_now: t,
        reservation,
        skip_late: false,
        attempt: 1,
    };
    let (decision, _) = run_reserved(ctx, blobs, job, settings, &this, run)
        .await
        .ok()?;
    match decision {
        Decision::Ran { entry } | Decision::JobFailed { entry } => Some(entry),
        _ => None,
    }
}
