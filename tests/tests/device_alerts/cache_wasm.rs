//! The gate cache in Spin's key-value store (`kv_cache`), as the release `.wasm` served by the
//! real `spin up` (each app its own SQLite `default` store), against Azurite behind a counting
//! proxy: throttles with no storage request, never a suppression storage would not make,
//! entries cleared before a gate goes back, a failing store (one Spin cannot open) falling
//! back to storage and costing no alert, another deployment's gate cached only once its
//! holder is done, two accounts behind one origin sharing a store apart, a reader whose clock
//! is behind storage's throttling no longer than storage, and the gate API never cached. The store is not inspected: an entry shows as
//! a throttle answered `"cached": true` with no storage request, its absence as an answer that
//! asked storage (or alerted).

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{LockStatus, Locks};
use leasegate::ops::CreateContainer;
use leasegate::signing::{SasPermissions, SasResource, ServiceSas};
use leasegate::{Account, AccountKey, BlobClient, BlobEndpoint, Credential, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, Answer, App, Setup};
use leasegate_tests::proxy::Proxy;
use leasegate_tests::{unique_container, wait_for, Azurite, SECOND_ACCOUNT};
use serde_json::{json, Value};

use crate::door::Door;

const GATE_AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

/// A runtime config whose `default` store cannot be opened: a SQLite store whose file is a
/// folder. Spin starts with it and fails every open of the store at once. (A Redis store on a
/// port nobody listens on is no failing store under Spin 4.1: the first key-value call waits
/// for it, and the request was still unanswered after 5 minutes.)
fn failing_store(dir: &std::path::Path) -> String {
    let folder = dir.join("store-is-a-folder.db");
    std::fs::create_dir_all(&folder).expect("create the folder");
    format!(
        "[key_value_store.default]\ntype = \"spin\"\npath = \"{}\"\n",
        folder.display()
    )
}

fn reading(device: &str, temperature: f64) -> Value {
    json!({ "deviceId": device, "temperature": temperature })
}

fn decision(answer: &Answer) -> &Value {
    &answer.json["decisions"][0]
}

/// Storage's view of a lock: its expiry if held.
fn held_until(app: &App, prefix: &str, name: &str) -> Option<SystemTime> {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix(prefix);
    let info =
        block_on(locks.inspect(&LockName::try_new(name).unwrap(), SystemTime::now())).unwrap();
    match info.status {
        LockStatus::Held { expires_at, .. } => Some(expires_at.unwrap_or(SystemTime::UNIX_EPOCH)),
        LockStatus::Available => None,
    }
}

/// One reading of `device`, and the storage requests it cost.
fn post(app: &App, device: &str, temperature: f64) -> (Answer, usize) {
    app.storage_requests(|| post_telemetry(app, &reading(device, temperature)))
}

/// `answer` is a throttle storage was asked for (no cache entry stood for it).
fn asked_storage(answer: &Answer, requests: usize) {
    let d = decision(answer);
    assert_eq!(d["decision"], "throttled", "{}", answer.text);
    assert!(d["cached"].is_null(), "{}", answer.text);
    assert_eq!(requests, 1, "{}", answer.text);
}

/// `answer` is a throttle told by the cache: no storage request.
fn from_cache(answer: &Answer, requests: usize) {
    let d = decision(answer);
    assert_eq!(d["decision"], "throttled", "{}", answer.text);
    assert_eq!(d["cached"], true, "{}", answer.text);
    assert_eq!(requests, 0, "{}", answer.text);
}

/// A device that alerted is throttled from the cache: no storage request, and storage agrees
/// (its gate is held at least as long as the answer says). A batch of throttled devices is
/// no storage request either.
#[test]
fn a_throttle_known_from_the_cache_needs_no_storage_request() {
    let app = App::start("kvon", &[("alert_window_seconds", "60")]);
    let (first, first_requests) = post(&app, "kv-1", 40.0);
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    // First use of the app's container: HEAD 404 (`ContainerNotFound`), create the container,
    // create the lock blob with the claim, acquire its lease (and write the claim again when
    // the grant landed in a later second than the HEAD).
    assert!((4..=5).contains(&first_requests), "{first_requests}");
    let mut took = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let (again, requests) = post(&app, "kv-1", 41.0);
        took.push(started.elapsed());
        from_cache(&again, requests);
        // Storage would throttle it as long.
        let until = held_until(&app, "alerts/", "kv-1").expect("storage holds the gate");
        let said = Duration::from_secs(decision(&again)["retryAfterSeconds"].as_u64().unwrap());
        assert!(SystemTime::now() + said <= until + Duration::from_secs(1));
    }
    took.sort();
    println!(
        "cached throttle: median {:?} per request, 0 storage requests",
        took[took.len() / 2]
    );
    // A batch: 30 devices alert, then all 30 are throttled from the cache.
    let batch: Vec<Value> = (0..30)
        .map(|i| reading(&format!("kvb-{i}"), 35.0))
        .collect();
    let (cold, cold_requests) = app.storage_requests(|| post_telemetry(&app, &json!(batch)));
    // 3 per new device (HEAD 404, create with the claim, acquire), 4 when the create lands in
    // a later second than the HEAD (the claim's token is made again from the create's Date).
    assert!(
        (90..=120).contains(&cold_requests),
        "{cold_requests}: {}",
        cold.text
    );
    let (warm, warm_requests) = app.storage_requests(|| post_telemetry(&app, &json!(batch)));
    assert!(
        warm.json["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["decision"] == "throttled" && d["cached"] == true),
        "{}",
        warm.text
    );
    assert_eq!(warm_requests, 0);
    assert_eq!(app.sink.delivered().len(), 31);
    app.assert_no_trap();
}

/// `kv_cache = off`: every throttle asks storage, and the store is not touched. The app shares
/// its `default` store (one SQLite file) and its storage origin (so the cache keys) with apps
/// whose cache is on: an entry it wrote would be read by them, which would then answer from
/// the cache.
#[test]
fn with_the_cache_off_every_throttle_asks_storage() {
    let dir = leasegate_tests::spin::scratch_dir("kvshared");
    let shared_store = format!(
        "[key_value_store.default]\ntype = \"spin\"\npath = \"{}\"\n",
        dir.join("shared.db").display()
    );
    let on = App::start_with(
        "kvoff-on",
        &[("alert_window_seconds", "60")],
        Setup {
            runtime_config: Some(shared_store.clone()),
            ..Setup::default()
        },
    );
    let origin = on.storage.origin();
    let off = App::start_with(
        "kvoff",
        &[
            ("alert_window_seconds", "60"),
            ("kv_cache", "off"),
            ("storage_origin", &origin),
        ],
        Setup {
            container: Some(on.container.clone()),
            runtime_config: Some(shared_store.clone()),
            ..Setup::default()
        },
    );
    // (`off` sends its requests through `on`'s proxy: its counts are taken there.)
    let (first, _) = post(&off, "kv-off", 40.0);
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    for _ in 0..3 {
        let (again, requests) =
            on.storage_requests(|| post_telemetry(&off, &reading("kv-off", 40.0)));
        asked_storage(&again, requests);
    }
    // The app with the cache on finds no entry for the gate `off` holds (a young tenure of
    // another deployment, which it does not cache itself).
    let (seen, requests) = post(&on, "kv-off", 40.0);
    asked_storage(&seen, requests);
    // The store is shared: an entry `on` writes for its own alert is read by a third app with
    // the cache on (answered from the cache, no storage request), while `off` still asks.
    let peer = App::start_with(
        "kvoff-peer",
        &[("alert_window_seconds", "60"), ("storage_origin", &origin)],
        Setup {
            container: Some(on.container.clone()),
            runtime_config: Some(shared_store),
            ..Setup::default()
        },
    );
    let (own, _) = post(&on, "kv-on", 40.0);
    assert_eq!(decision(&own)["decision"], "notified", "{}", own.text);
    let (cached, requests) = on.storage_requests(|| post_telemetry(&peer, &reading("kv-on", 40.0)));
    from_cache(&cached, requests);
    let (asked, requests) = on.storage_requests(|| post_telemetry(&off, &reading("kv-on", 40.0)));
    asked_storage(&asked, requests);
    let alerts: usize = [&on, &off, &peer]
        .iter()
        .map(|a| a.sink.delivered().len())
        .sum();
    assert_eq!(alerts, 2);

    let bad = App::start("kvbad", &[("kv_cache", "sometimes")]);
    let a = post_telemetry(&bad, &reading("x", 40.0));
    assert_eq!(a.status, 503, "{}", a.text);
    assert!(a.text.contains("kv_cache"), "{}", a.text);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A notification that certainly did not arrive (the webhook's port refuses connections) gives
/// the gate back, and leaves no entry: the next reading alerts, and only then is the device
/// throttled from the cache.
#[test]
fn a_failed_notification_leaves_no_entry_behind() {
    let door = Door::closed();
    let app = App::start(
        "kvnotify",
        &[
            ("alert_window_seconds", "60"),
            ("notify_origin", &door.origin()),
        ],
    );
    let refused = post_telemetry(&app, &reading("kv-n", 44.0));
    let d = decision(&refused);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["delivery"], "not_delivered", "{d}");
    assert_eq!(d["gateReleased"], true, "{d}");
    assert_eq!(held_until(&app, "alerts/", "kv-n"), None);
    door.open(&app.webhook.authority());
    let (back, requests) = post(&app, "kv-n", 45.0);
    assert_eq!(decision(&back)["decision"], "notified", "{}", back.text);
    assert!(requests >= 2, "{requests}: not from the cache");
    let (again, requests) = post(&app, "kv-n", 45.0);
    from_cache(&again, requests);
    assert_eq!(app.sink.for_device("kv-n").len(), 1);
}

/// A store that fails (Spin cannot open it): decisions fall back to storage (nothing
/// suppressed from the cache), and a failed notification still gives its gate back (the store
/// costs requests, never alerts). The failing app shares its container with a healthy one.
#[test]
fn a_failing_store_falls_back_to_storage_and_costs_no_alert() {
    let healthy = App::start("kvfail-ok", &[("alert_window_seconds", "60")]);
    let dir = leasegate_tests::spin::scratch_dir("kvfail");
    let door = Door::closed();
    let failing = App::start_with(
        "kvfail",
        &[
            ("alert_window_seconds", "60"),
            ("notify_origin", &door.origin()),
        ],
        Setup {
            container: Some(healthy.container.clone()),
            runtime_config: Some(failing_store(&dir)),
            ..Setup::default()
        },
    );
    let (first, _) = post(&healthy, "kv-f", 40.0);
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    for _ in 0..2 {
        let (again, requests) = post(&failing, "kv-f", 40.0);
        asked_storage(&again, requests);
    }
    // The webhook is unreachable and the store cannot be cleared: the gate goes back anyway
    // (this invocation wrote no entry for it), and the next reading alerts.
    let refused = post_telemetry(&failing, &reading("kv-g", 44.0));
    let d = decision(&refused);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["gateReleased"], true, "{d}");
    assert!(
        d["reason"].as_str().unwrap().contains("key-value store"),
        "{d}"
    );
    assert_eq!(held_until(&failing, "alerts/", "kv-g"), None);
    door.open(&failing.webhook.authority());
    let (later, _) = post(&failing, "kv-g", 44.0);
    assert_eq!(decision(&later)["decision"], "notified", "{}", later.text);
    // Its own gate is not remembered either: storage is asked.
    let (after, requests) = post(&failing, "kv-g", 44.0);
    asked_storage(&after, requests);
    // The healthy app's cache is untouched by its neighbour's failures.
    let (cached, requests) = post(&healthy, "kv-f", 40.0);
    from_cache(&cached, requests);
    assert_eq!(healthy.sink.for_device("kv-f").len(), 1);
    assert_eq!(failing.sink.for_device("kv-g").len(), 1);
    assert_eq!(
        healthy.sink.delivered().len() + failing.sink.delivered().len(),
        2
    );
    healthy.assert_no_trap();
    failing.assert_no_trap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A runtime config whose `default` store is the SQLite file `path`: apps given the same one
/// share their store.
fn shared_store(path: &std::path::Path) -> String {
    format!(
        "[key_value_store.default]\ntype = \"spin\"\npath = \"{}\"\n",
        path.display()
    )
}

/// Two storage accounts behind one origin (path style, as Azurite and a proxy in front of
/// storage serve them), each reached by a connection string with a SAS and no `AccountName`,
/// as an application is given one, with containers of the same name, sharing one key-value
/// store: a device's alert in one account does not suppress the same device's alert in the
/// other, and each account's throttles are still answered from the cache.
#[test]
fn two_accounts_behind_one_origin_keep_their_entries_apart() {
    let azurite = Azurite::shared_two_accounts();
    // Both apps reach storage through this one origin.
    let proxy = Proxy::start(&azurite.authority());
    let origin = proxy.origin();
    let container = unique_container("kvaccounts");
    let dev = (leasegate::DEV_ACCOUNT_NAME, leasegate::DEV_ACCOUNT_KEY);
    let connection_strings: Vec<String> = [dev, SECOND_ACCOUNT]
        .into_iter()
        .map(|(name, key)| {
            let key = AccountKey::try_new(key).unwrap();
            let endpoint = format!("http://{}/{name}", azurite.authority());
            let account = Account::new(
                name,
                BlobEndpoint::try_new(&endpoint).unwrap(),
                Credential::SharedKey(key.clone()),
            );
            // A SAS reaches blobs but cannot create its container: created here first.
            let client = BlobClient::new(NativeTransport::default(), account, container.clone());
            let create = CreateContainer {
                container: container.clone(),
            };
            block_on(client.execute(&create, SystemTime::now())).unwrap();
            let sas = ServiceSas {
                resource: SasResource::Container(container.clone()),
                permissions: SasPermissions::all(),
                start: None,
                expiry: SystemTime::now() + Duration::from_secs(3600),
                protocol: None,
            }
            .token(name, &key)
            .unwrap();
            format!(
                "BlobEndpoint={origin}/{name};SharedAccessSignature={}",
                sas.query()
            )
        })
        .collect();
    let dir = leasegate_tests::spin::scratch_dir("kvaccounts");
    let store = shared_store(&dir.join("shared.db"));
    let apps: Vec<App> = connection_strings
        .iter()
        .enumerate()
        .map(|(i, cs)| {
            App::start_with(
                &format!("kvaccounts-{i}"),
                &[
                    ("alert_window_seconds", "60"),
                    ("storage_origin", &origin),
                    ("storage_connection_string", cs),
                ],
                Setup {
                    azurite: Some(azurite),
                    container: Some(container.clone()),
                    runtime_config: Some(store.clone()),
                    ..Setup::default()
                },
            )
        })
        .collect();
    for app in &apps {
        let first = post_telemetry(app, &reading("kv-acct", 40.0));
        assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    }
    // Each account's own gate is cached (counted at the shared proxy).
    for app in &apps {
        let (again, requests) = proxy.during(|| post_telemetry(app, &reading("kv-acct", 40.0)));
        from_cache(&again, requests.len());
    }
    for app in &apps {
        assert_eq!(app.sink.for_device("kv-acct").len(), 1);
        app.assert_no_trap();
    }
    drop(apps);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader whose clock is 10 s behind storage's, sharing the key-value store with a writer
/// whose clock is right, does not throttle a device from the cache once storage's gate has run
/// out: the next reading after the window alerts, and the window it opens still throttles
/// both deployments (one alert each window). The reader has answered one reading of its own
/// before (how it learns how far behind its clock is: docs/functions.md, the gate cache).
#[test]
fn a_reader_whose_clock_is_behind_throttles_no_longer_than_storage() {
    let dir = leasegate_tests::spin::scratch_dir("kvclock");
    let store = shared_store(&dir.join("shared.db"));
    let window = [("alert_window_seconds", "15")];
    let writer = App::start_with(
        "kvclock-w",
        &window,
        Setup {
            runtime_config: Some(store.clone()),
            ..Setup::default()
        },
    );
    let origin = writer.storage.origin();
    let reader = App::start_with(
        "kvclock-r",
        &[("alert_window_seconds", "15"), ("storage_origin", &origin)],
        Setup {
            container: Some(writer.container.clone()),
            runtime_config: Some(store),
            clock_offset_ms: -10_000,
            ..Setup::default()
        },
    );
    let own = post_telemetry(&reader, &reading("kv-clock-own", 40.0));
    assert_eq!(decision(&own)["decision"], "notified", "{}", own.text);
    let first = post_telemetry(&writer, &reading("kv-clock", 40.0));
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    let ends = held_until(&writer, "alerts/", "kv-clock").expect("storage holds the gate");
    // Storage's gate runs out (its clock is this machine's): the reader's next reading alerts.
    let wait = ends.duration_since(SystemTime::now()).unwrap_or_default();
    std::thread::sleep(wait);
    wait_for("storage's gate to run out", Duration::from_secs(5), || {
        held_until(&writer, "alerts/", "kv-clock")
            .is_none()
            .then_some(())
    });
    let (after, requests) =
        writer.storage_requests(|| post_telemetry(&reader, &reading("kv-clock", 40.0)));
    assert_eq!(decision(&after)["decision"], "notified", "{}", after.text);
    assert!(requests >= 1, "{requests}: {}", after.text);
    // The new window throttles both, whatever their clocks.
    for app in [&writer, &reader] {
        let t = post_telemetry(app, &reading("kv-clock", 40.0));
        assert_eq!(decision(&t)["decision"], "throttled", "{}", t.text);
    }
    assert_eq!(writer.sink.for_device("kv-clock").len(), 1);
    assert_eq!(reader.sink.for_device("kv-clock").len(), 1);
    reader.assert_no_trap();
    drop((writer, reader));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another deployment's gate is cached only once its tenure is old enough that its holder is
/// done notifying and any give-back (ten storage timeouts and the margin: 8 s here); until then
/// every throttle asks storage.
#[test]
fn another_deployments_gate_is_cached_once_settled() {
    let vars = [
        ("alert_window_seconds", "60"),
        ("storage_timeout_ms", "500"),
    ];
    let a = App::start("kvsettle-a", &vars);
    let b = App::start_with(
        "kvsettle-b",
        &vars,
        Setup {
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    let won = post_telemetry(&a, &reading("kv-s", 40.0));
    assert_eq!(decision(&won)["decision"], "notified");
    let won_at = Instant::now();
    let (seen, requests) = post(&b, "kv-s", 40.0);
    asked_storage(&seen, requests);
    let cached_at = wait_for(
        "B to cache A's settled gate",
        Duration::from_secs(30),
        || {
            let (t, requests) = post(&b, "kv-s", 40.0);
            assert_eq!(decision(&t)["decision"], "throttled", "{}", t.text);
            if decision(&t)["cached"] == true {
                from_cache(&t, requests);
                Some(Instant::now())
            } else {
                // Until then, no entry: storage is asked.
                asked_storage(&t, requests);
                None
            }
        },
    );
    // (Storage dates the tenure to the whole second: up to 1 s earlier than `won_at`.)
    assert!(cached_at.duration_since(won_at) >= Duration::from_secs(7));
    assert_eq!(a.sink.delivered().len() + b.sink.delivered().len(), 1);
}

/// The gate API never caches (its holders give gates back at will, and the store has no
/// compare-and-swap): a busy gate is one storage request every time, and a holder that
/// shortens its gate to 1 s frees it for others as soon as storage does.
#[test]
fn the_gate_api_always_asks_storage() {
    let gate = |app: &App, method: &str, path: &str| {
        call(
            method,
            &app.url(&format!("/api/gate/{path}")),
            &[GATE_AUTH],
            b"",
        )
    };
    let app = App::start("kvgate", &[]);
    let a = gate(&app, "POST", "g1?window=3600&holder=alpha");
    assert_eq!(a.status, 200, "{}", a.text);
    for _ in 0..3 {
        let (b, requests) = app.storage_requests(|| gate(&app, "POST", "g1?window=30&holder=beta"));
        assert_eq!(b.status, 429, "{}", b.text);
        assert_eq!(b.json["holder"], "alpha", "{}", b.text);
        assert!(b.json["cached"].is_null(), "{}", b.text);
        assert_eq!(requests, 1);
    }
    // alpha shortens its gate to 1 s (with its lease id: the name selects none): beta gets it
    // once storage lets it go.
    let alpha = a.json["leaseId"].as_str().unwrap();
    let short = call(
        "POST",
        &app.url("/api/gate/g1?window=1&holder=alpha"),
        &[GATE_AUTH, ("lease-id", alpha)],
        b"",
    );
    assert_eq!(short.status, 200, "{}", short.text);
    assert_eq!(short.json["extended"], true);
    assert_eq!(short.json["leaseId"], alpha);
    wait_for("beta to take the gate", Duration::from_secs(15), || {
        (gate(&app, "POST", "g1?window=30&holder=beta").status == 200).then_some(())
    });
}
