//! The log's unit tests: trimming, settling, counting, the history's start.
use super::*;
use crate::at;

use crate::settings::tests::{settings, settings_with};
use leasegate_spin::web::rfc3339;

/// The end of a run starts from its own first write: the log and ETag as written, and the
/// server's time as that write's `Date` plus the time since its answer, in whole seconds
/// (never ahead of storage's clock by more than this instance's timing of it). Without an
/// ETag there is nothing to write at: the log is read.
#[test]
fn a_log_write_starts_the_next_change_at_its_etag_and_date() {
    let date = at(1_795_359_300);
    let answered = Instant::now() - std::time::Duration::from_millis(2_500);
    let log = Log {
        job: "nightly".into(),
        cleaned_before: 7,
        ..Log::default()
    };
    let written = LogWrite {
        date,
        log: log.clone(),
        clean_up: false,
        etag: Some(leasegate::ETag::new("\"0x8D\"")),
        answered,
    };
    let (start, etag, read_at) = written.clone().start().expect("an ETag");
    assert_eq!(start, log);
    assert_eq!(etag, Some(leasegate::ETag::new("0x8D")));
    let secs = unix(read_at);
    assert!((1_795_359_302..=1_795_359_303).contains(&secs), "{secs}");
    assert_eq!(read_at, at(secs), "whole seconds");
    let no_etag = LogWrite {
        etag: None,
        ..written
    };
    assert!(no_etag.start().is_none());
}

fn entry_at(o: u64, status: &str) -> LogEntry {
    LogEntry {
        occurrence: rfc3339(at(o)),
        occurrence_unix: o,
        instance: "i".into(),
        reserved_at: rfc3339(at(o)),
        status: RunStatus::parse(status),
        fencing_token: None,
        trigger: "cron".into(),
        past_due: false,
        finished_at: None,
        reason: None,
        attempt: None,
    }
}

#[test]
fn the_settled_watermark_moves_over_logged_occurrences_only() {
    let s = settings(60, 0, 300);
    let now = |t: u64| at(t);
    // A log of an older version (no watermark): it starts before its oldest entry, so the
    // gaps between its entries are looked at (540 has none here).
    let mut log = Log {
        job: "j".into(),
        entries: vec![entry_at(600, "succeeded"), entry_at(480, "succeeded")],
        ..Log::default()
    };
    advance_settled(&mut log, &s, 600, 0, now(600));
    assert_eq!(log.settled_through, 480);
    // Settled by a winner through 540: on over 600.
    advance_settled(&mut log, &s, 600, 540, now(600));
    assert_eq!(log.settled_through, 600);
    // 660 has no entry (abandoned, or nobody ticked): the watermark stops before it even
    // when 720 is logged.
    log.entries.push(entry_at(720, "succeeded"));
    advance_settled(&mut log, &s, 720, 0, now(720));
    assert_eq!(log.settled_through, 600);
    advance_settled(&mut log, &s, 720, 660, now(720));
    assert_eq!(log.settled_through, 720);
    // A new log starts at the occurrence before the first; a run going (or a failed one
    // with retries left) holds the watermark before it until it ends.
    let mut new = Log::default();
    new.entries.push(entry_at(1200, "running"));
    advance_settled(&mut new, &s, 1200, 0, now(1200));
    assert_eq!(new.settled_through, 1140);
    new.entries[0].status = RunStatus::Succeeded;
    advance_settled(&mut new, &s, 1200, 0, now(1200));
    assert_eq!(new.settled_through, 1200);
    // Never more than the lookback behind the storage server's clock.
    let mut far = Log {
        settled_through: 60,
        ..Log::default()
    };
    far.entries.push(entry_at(60 * 1000, "running"));
    advance_settled(&mut far, &s, 60 * 1000, 0, now(60 * 1000));
    assert_eq!(far.settled_through, 60 * 1000 - s.lookback().as_secs());
    // Below the clean-up watermark counts as settled.
    let mut cleaned = Log {
        settled_through: 600,
        cleaned_before: 800,
        ..Log::default()
    };
    cleaned.entries.push(entry_at(840, "succeeded"));
    advance_settled(&mut cleaned, &s, 840, 0, now(840));
    assert_eq!(cleaned.settled_through, 840);
    // Written only once known: an old log is written back as it was.
    assert!(!serde_json::to_string(&Log::default())
        .unwrap()
        .contains("settledThrough"));
    assert!(serde_json::to_string(&log)
        .unwrap()
        .contains("\"settledThrough\":720"));
}

/// Review: a buffered occurrence stays known to the log however many entries come after
/// it, so a second one is refused (`buffer_one` keeps one).
#[test]
fn a_buffered_occurrence_outlives_the_last_ten() {
    let s = settings(60, 0, 300);
    let mut log = Log::default();
    log.entries.push(entry_at(120, "pending"));
    for k in 0..12 {
        log.entries
            .insert(0, entry_at(180 + 60 * k, "skipped_overlap"));
        trim(&mut log, &s);
    }
    assert_eq!(log.entries.len(), LOG_ENTRIES + 1);
    assert_eq!(log.entries.last().unwrap().occurrence_unix, 120);
    assert_eq!(log.trimmed_through, 180 + 60);
    // Below the clean-up watermark it is gone for good (its reservation may be deleted):
    // trimmed, and it holds nothing.
    let mut ghost = log.clone();
    ghost.cleaned_before = 150;
    trim(&mut ghost, &s);
    assert_eq!(ghost.entries.len(), LOG_ENTRIES);
    // And the watermark does not pass it while it is open.
    log.settled_through = 60;
    advance_settled(&mut log, &s, 900, 0, at(100_000));
    assert!(log.settled_through < 120, "{}", log.settled_through);
}

/// Review: a failed occurrence with retries left holds the watermark, whatever the retry
/// delay (the lookback and the retention grow with the retries' span, and the floor stops
/// before an open entry).
#[test]
fn the_watermark_waits_for_a_failed_occurrences_retries() {
    let s = settings_with(&[
        ("job_schedule", "* * * * *"),
        ("job_retries", "3"),
        ("job_retry_delay_seconds", "7200"),
    ]);
    assert!(s.lookback().as_secs() > 3 * 7200, "{:?}", s.lookback());
    assert!(s.retention.as_secs() > 3 * 7200, "{:?}", s.retention);
    const X: u64 = 1_795_765_620;
    let mut log = Log {
        settled_through: X - 60,
        ..Log::default()
    };
    let mut failed = entry_at(X, "failed");
    failed.attempt = Some(1);
    log.entries.push(failed);
    for later in [X + 3900, X + 7300, X + 30_000] {
        advance_settled(&mut log, &s, later, 0, at(later));
        assert!(log.settled_through < X, "passed X at {later}");
    }
    // Its last attempt failed: settled.
    log.entries[0].attempt = Some(4);
    advance_settled(&mut log, &s, X + 60, 0, at(X + 100));
    assert!(log.settled_through >= X);
}

/// Second review: a failed occurrence with retries left outlives ten newer entries (a long
/// pause's `skipped_paused`), so the watermark still waits for it, and the occurrences the
/// log once held are not counted missed when the watermark jumps.
#[test]
fn an_open_failed_entry_outlives_a_long_pause_and_nothing_is_counted_twice() {
    let s = settings_with(&[("job_period_seconds", "60"), ("job_retries", "1")]);
    const X: u64 = 1_795_765_620;
    let mut log = Log {
        settled_through: X - 60,
        ..Log::default()
    };
    let mut failed = entry_at(X, "failed");
    failed.attempt = Some(1);
    log.entries.push(failed);
    // A day of paused ticks.
    for k in 1..=1440 {
        let o = X + 60 * k;
        log.entries.insert(0, entry_at(o, "skipped_paused"));
        trim(&mut log, &s);
        advance_settled(&mut log, &s, o, 0, at(o));
    }
    assert!(log.entries.iter().any(|e| e.occurrence_unix == X));
    assert!(log.settled_through < X);
    assert_eq!(log.counters.missed, 0);
    // Its retry ran and succeeded: the watermark jumps, counting nothing missed.
    log.entries.retain(|e| e.occurrence_unix != X);
    trim(&mut log, &s);
    advance_settled(&mut log, &s, X + 60 * 1440, 0, at(X + 60 * 1440));
    assert!(log.settled_through > X);
    assert_eq!(log.counters.missed, 0, "{:?}", log.entries.last());
}

/// The review's cases: the watermark never passes a reservation before its reserver's
/// deadline, whatever the period, the timeout or a tick far ahead.
#[test]
fn the_watermark_waits_for_a_reservers_deadline() {
    // A per-5-second job with a 330 s lease term: X abandoned, every later occurrence
    // logged up to X + 325 (65 periods): the watermark stays below X.
    let s = settings_with(&[("job_period_seconds", "5"), ("job_timeout_seconds", "300")]);
    const X: u64 = 1_795_765_620;
    let mut log = Log {
        settled_through: X - 5,
        ..Log::default()
    };
    for k in 1..=65 {
        log.entries.push(entry_at(X + 5 * k, "succeeded"));
        log.entries.retain(|e| e.occurrence_unix + 50 > X + 5 * k);
        advance_settled(&mut log, &s, X + 5 * k, 0, at(X + 5 * k));
        assert!(log.settled_through < X, "passed X at {k}");
    }
    // A tick far ahead of the clock (an admin's, or a clock ahead) does not move it.
    advance_settled(&mut log, &s, X + 290, 0, at(X + 2));
    assert!(log.settled_through < X);
}
