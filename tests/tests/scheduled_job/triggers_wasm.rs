//! One schedule, three kinds of trigger, one container: scheduled-job deployed three times
//! under the real `spin up` (distinct `instance_id`s), one on Spin's cron trigger (the real
//! plugin, `spin-cron.toml`), one ticked over HTTP by the shipped SpinKube ticker
//! (`deploy/spinkube/ticker.py`, the real process) and one invoked as an Azure Functions custom
//! handler with the timer payload the Functions host POSTs. Every occurrence they all fire runs
//! exactly once, none is missed, and each kind of trigger wins some: read back from the job calls
//! the sinks received and from every reservation in storage.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use leasegate_tests::app::{call, Answer, App, Manifest, Setup, TIMER_TOKEN};
use leasegate_tests::jobs::{azure_timer_payload, decisions, reservations, JOB};
use leasegate_tests::process::Ticker;
use leasegate_tests::proxy::Fault;
use leasegate_tests::unix_now;

/// The job's schedule (a calendar one, with seconds) and the gap between its occurrences.
const SCHEDULE: &str = "*/5 * * * * *";
const PERIOD: u64 = 5;

/// How long the three triggers fire together.
const TICKING: Duration = Duration::from_secs(75);

/// The three deployments: (instance id, the trigger kind its ticks log and its calls carry).
const CRON: (&str, &str) = ("spin-cron", "cron");
const TICKED: (&str, &str) = ("spinkube-pod", "http");
const FUNCTIONS: (&str, &str) = ("functions-app", "azure");

fn deploy(instance: &str, manifest: Manifest, container: Option<&leasegate::ContainerName>) -> App {
    let cron = if manifest == Manifest::Cron {
        vec![("scheduled-job", SCHEDULE)]
    } else {
        Vec::new()
    };
    App::start_with(
        "triggers",
        &[
            ("instance_id", instance),
            ("job_schedule", SCHEDULE),
            ("job_timeout_seconds", "3"),
        ],
        Setup {
            manifest,
            cron,
            container: container.cloned(),
            ..Setup::default()
        },
    )
}

fn millis_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Which deployment's tick reaches storage first at occurrence `o`, in turn: 0 the Functions
/// app's (its host's clock a little ahead), 1 the ticked pod's (the Functions host a little
/// behind; the cron plugin fires 0.3–0.5 s after the second on this machine), 2 the cron one's
/// (the pod's network to storage slow as well). Without turns the cron deployment never wins:
/// the others' ticks reach storage within a few milliseconds of the second.
fn first_to_storage(o: u64) -> u64 {
    o / PERIOD % 3
}

/// How far the Functions host's clock is ahead of this machine's when it fires `o` (behind:
/// negative), in milliseconds: a host's clock and its timer are a little off, either way.
fn host_skew_ms(o: u64) -> i64 {
    if first_to_storage(o) == 0 {
        300
    } else {
        -800
    }
}

/// The Functions host's timer for `app` (`"schedule": "*/5 * * * * *"`, `useMonitor`): each
/// occurrence, when the host's clock ([`host_skew_ms`] off this machine's) reaches it, a
/// `POST /scheduled-job` with an invocation id header and the timer payload (the schedule status
/// it kept: `Last` the occurrence before, `Next` this one; `IsPastDue: false`; `UtcNow` the
/// host's clock), until `until`. Returns each occurrence fired with the handler's answer.
fn functions_host(app: &App, until: Instant) -> Vec<(u64, Answer)> {
    let mut fired = Vec::new();
    let mut next = (unix_now() / PERIOD + 1) * PERIOD;
    loop {
        let skew = host_skew_ms(next);
        let fire_at = (next * 1000).saturating_add_signed(-skew);
        let wait = Duration::from_millis(fire_at.saturating_sub(millis_now()));
        if Instant::now() + wait >= until {
            return fired;
        }
        std::thread::sleep(wait);
        let utc_now_ms = millis_now().saturating_add_signed(skew);
        let invocation = uuid::Uuid::new_v4().to_string();
        let answer = call(
            "POST",
            &app.url("/scheduled-job"),
            &[
                ("content-type", "application/json"),
                ("x-azure-functions-invocationid", &invocation),
            ],
            &azure_timer_payload(next - PERIOD, next, utc_now_ms, false),
        );
        fired.push((next, answer));
        next += PERIOD;
    }
}

/// The job calls the deployments' sinks received, by occurrence: (instance, trigger, body),
/// each checked to carry its `Idempotency-Key` header's key and the instance and trigger of the
/// deployment whose sink received it.
fn job_calls<'a>(apps: &[(&App, (&'a str, &'a str))]) -> BTreeMap<u64, Vec<Call<'a>>> {
    let mut calls: BTreeMap<u64, Vec<Call>> = BTreeMap::new();
    for (app, (instance, trigger)) in apps {
        for r in app.sink.received().into_iter().filter(|r| r.path == "/job") {
            let o = r.body["occurrenceUnix"].as_u64().expect("occurrenceUnix");
            assert_eq!(r.body["instance"], *instance, "{}", r.body);
            assert_eq!(r.body["trigger"], *trigger, "{}", r.body);
            assert_eq!(
                r.idempotency_key.as_deref(),
                r.body["idempotencyKey"].as_str(),
                "{}",
                r.body
            );
            calls
                .entry(o)
                .or_default()
                .push((instance, trigger, r.body));
        }
    }
    calls
}

/// One job call: the instance and trigger it names, and its body.
type Call<'a> = (&'a str, &'a str, serde_json::Value);

/// Three deployments of scheduled-job on one container, one per kind of trigger, fire the same
/// per-5-second calendar schedule for 75 s (14 occurrences fired by all three, after the starts):
/// each runs exactly once, by the deployment that won its reservation, with that deployment's
/// instance, trigger, fencing token and idempotency key on the call and on the reservation; none
/// is missed; and every kind of trigger wins some (each reaches storage first in turn,
/// [`first_to_storage`], so winners and losers of every kind meet on one job).
///
/// 75 s is enough: each occurrence is one race of the same three ticks through the same steps,
/// and a double run or a miss shows on any single one; 14 races, each kind winning four or five,
/// cover every kind as winner and as loser, and a few minutes more would repeat those races on a
/// CI already near half its limit.
#[test]
fn the_cron_trigger_the_spinkube_ticker_and_the_functions_timer_run_each_occurrence_once() {
    let cron = deploy(CRON.0, Manifest::Cron, None);
    let container = cron.container.clone();
    let ticked = deploy(TICKED.0, Manifest::Http, Some(&container));
    let functions = deploy(FUNCTIONS.0, Manifest::Azure, Some(&container));
    let first = unix_now();
    // The pod's network to storage is slow (1.5 s, within the storage timeout) at the
    // occurrences the cron deployment is to reach storage first.
    for o in (first / PERIOD..)
        .map(|k| k * PERIOD)
        .take_while(|o| *o < first + 120)
    {
        if first_to_storage(o) == 2 {
            ticked.storage.fault_on(
                &format!("/occurrences/{o:012}"),
                Fault::Delay(Duration::from_millis(1500)),
            );
        }
    }
    let ticker = Ticker::start(
        &[ticked.spin.addr()],
        TIMER_TOKEN,
        &format!("{PERIOD} /api/jobs/{JOB}/tick\n"),
    );
    // This thread is the Functions host's timer.
    let fired = functions_host(&functions, Instant::now() + TICKING);
    // The timers stop now (the Functions host's loop ended; the ticker is stopped next).
    let stopped = unix_now();
    let ticks = ticker.stop();
    // Let the last runs end.
    std::thread::sleep(Duration::from_secs(4));
    // Every occurrence all three fired: from 2 s after the ticker started (a Python start on a
    // loaded machine), to the last one 3 s before the timers stopped (a tick whose storage is
    // slowed 1.5 s has ended by then, its line written).
    let window: Vec<u64> = ((first + 2).div_ceil(PERIOD)..)
        .map(|k| k * PERIOD)
        .take_while(|o| *o + 3 < stopped)
        .collect();
    let apps = [(&cron, CRON), (&ticked, TICKED), (&functions, FUNCTIONS)];
    for (app, _) in &apps {
        app.assert_no_trap();
    }

    // Each trigger fired each occurrence, and its deployment logged a decision for it.
    for (o, answer) in &fired {
        assert_eq!(answer.status, 200, "the timer for {o}: {}", answer.text);
    }
    let fired_at: BTreeSet<u64> = fired.iter().map(|(o, _)| *o).collect();
    let ticked_at: BTreeSet<u64> = ticks
        .iter()
        .filter(|l| l["event"] == "tick")
        .map(|l| {
            assert_eq!(l["status"], 200, "a tick failed: {l}");
            l["at"].as_u64().expect("at")
        })
        .collect();
    let logged: Vec<_> = apps
        .iter()
        .map(|(app, (_, trigger))| decisions(app, trigger))
        .collect();
    for o in &window {
        assert!(fired_at.contains(o), "the Functions timer missed {o}");
        assert!(ticked_at.contains(o), "the ticker missed {o}: {ticks:#?}");
        for (log, (_, (instance, _))) in logged.iter().zip(&apps) {
            assert!(
                log.contains_key(o),
                "{instance} logged no tick of {o}: {log:?}"
            );
        }
    }

    // The job calls: none twice (the whole run), and each of the window once.
    let calls = job_calls(&apps);
    let twice: Vec<_> = calls.iter().filter(|(_, c)| c.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "occurrences run more than once: {twice:#?}"
    );

    // Every reservation of the window: succeeded, reserved by the one that was called, with
    // its trigger and its token; none missed.
    let stored = reservations(&cron);
    let mut won: BTreeMap<&str, usize> = BTreeMap::new();
    for o in &window {
        let reservation = stored
            .get(o)
            .unwrap_or_else(|| panic!("no reservation of {o}: {stored:#?}"));
        let [(instance, trigger, body)] = calls.get(o).map(Vec::as_slice).unwrap_or_default()
        else {
            panic!("occurrence {o} was not run: {reservation:?}");
        };
        let meta = |k: &str| reservation.get(k).map(String::as_str);
        assert_eq!(
            meta("leasegate_run"),
            Some("succeeded"),
            "{o}: {reservation:?}"
        );
        assert_eq!(
            meta("leasegate_reserved_by"),
            Some(*instance),
            "{o}: {reservation:?}"
        );
        assert_eq!(
            meta("leasegate_trigger"),
            Some(*trigger),
            "{o}: {reservation:?}"
        );
        assert_eq!(
            meta("leasegate_run_token").and_then(|t| t.parse::<u64>().ok()),
            body["fencingToken"].as_u64(),
            "{o}: {reservation:?}, {body}"
        );
        // The winner's deployment logged `ran`; the two others lost the reservation on time.
        for (log, (_, (id, _))) in logged.iter().zip(&apps) {
            let expected = if id == instance { "ran" } else { "skipped" };
            assert!(
                log[o].iter().any(|(d, _)| d == expected)
                    && log[o].iter().filter(|(d, _)| d == "ran").count()
                        == usize::from(id == instance),
                "{id} on {o} (won by {instance}): {:?}",
                log[o]
            );
        }
        *won.entry(trigger).or_default() += 1;
    }
    let keys: BTreeSet<&str> = window
        .iter()
        .filter_map(|o| calls[o][0].2["idempotencyKey"].as_str())
        .collect();
    assert_eq!(
        keys.len(),
        window.len(),
        "one idempotency key per occurrence"
    );
    println!(
        "triggers: {} occurrences over {} s, each run once; won: {won:?}",
        window.len(),
        TICKING.as_secs()
    );
    for (_, trigger) in [CRON, TICKED, FUNCTIONS] {
        assert!(
            won.get(trigger).is_some_and(|n| *n > 0),
            "{trigger} never won an occurrence: {won:?}"
        );
    }
}
