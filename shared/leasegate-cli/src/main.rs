//! `leasegate`: take, show, release and break locks from a terminal.
//!
//! A lock is named by its path in the container, as the functions' answers and docs name it:
//! `gates/{key}` (the gate API), `alerts/{deviceId}` (device-alerts), `leader/{group}`,
//! `jobs/{job}/lock`, `jobs/{job}/occurrences/{n}`, `init/{name}`, `sweeper/...`. The container
//! comes from `--container` (default `leasegate`, the app's default).
//!
//! The storage account comes from the environment, in one of two ways (both set: an error):
//! * `LEASEGATE_CONNECTION_STRING`: an account key or a SAS (default, when neither way is
//!   set: `UseDevelopmentStorage=true`, a local Azurite);
//! * `LEASEGATE_BLOB_ENDPOINT` (`https://ACCOUNT.blob.core.windows.net`, or a path-style
//!   `https://localhost:PORT/devstoreaccount1`) with a Microsoft Entra ID token, for accounts
//!   whose Shared Key access is turned off. Either `LEASEGATE_ACCESS_TOKEN`, a token used as it
//!   is:
//!   ```sh
//!   export LEASEGATE_ACCESS_TOKEN="$(az account get-access-token \
//!       --resource https://storage.azure.com/ --query accessToken -o tsv)"
//!   ```
//!   or a service principal's client secret: `LEASEGATE_TENANT_ID`, `LEASEGATE_CLIENT_ID` and
//!   `LEASEGATE_CLIENT_SECRET` (and `LEASEGATE_AUTHORITY`, default
//!   `https://login.microsoftonline.com`); one token request serves the whole command. Not
//!   both; a missing variable of the three is named, and so is a token variable set without
//!   `LEASEGATE_BLOB_ENDPOINT`. The identity needs the Storage Blob Data Contributor role on
//!   the container. A token or a client secret goes only over https (or http to this machine).
//!
//! `leasegate status` (no job) reads the app's container from storage (module `overview`):
//! each leader group's leader and term, each job's last runs and reservations, the held gates,
//! the TTL sweeper's passes and progress; given the app's URL (below), each job's next
//! occurrences too, from the app (the schedule is not stored in the container). A table, or
//! `--json`. Long listings print progress lines on stderr.
//!
//! `leasegate status JOB` asks the scheduled-job app instead (`GET /api/jobs/{job}`, no
//! storage account needed) and prints the job's schedule and zone, its next occurrences,
//! whether it is paused, its policies, its counters and its last runs (`--json`: the app's
//! answer as it came). The app is `--app URL` or `LEASEGATE_APP_URL` (its base URL, e.g.
//! `http://127.0.0.1:3000`); the bearer token is `LEASEGATE_TIMER_TOKEN`, the app's
//! `timer_token` (its `admin_token` works too). That token goes only over https or over http
//! to this machine (127.0.0.0/8, `::1`, `localhost`): another URL is refused before any request.
//! A refusal by the app prints its `error` and `message` and exits non-zero.
//!
//! No token or secret is printed, in an answer or an error.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Parser, Subcommand};
use leasegate::lease::{Acquire, Acquiring, IdOrigin, LockStatus, Locks, Release, Start, Term};
use leasegate::ops::{Condition, DeleteBlob, DeleteOutcome, Lease, LeaseAction};
use leasegate::{BlobClient, ContainerName, Counting, HolderKey, LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};

mod environment;
mod overview;
mod status;
use environment::explain;

/// Shown after the commands: how locks are named, and where the account comes from.
const LOCKS_AND_ENVIRONMENT: &str = "\
LOCK is the lock's path in the container, as the functions name it:
  gates/KEY                  the gate API's gate KEY (POST /api/gate/KEY)
  alerts/DEVICE              device-alerts' gate of DEVICE
  leader/GROUP               the leader election of GROUP
  jobs/JOB/lock              scheduled-job's lease of JOB (jobs/JOB/occurrences/N with overlap)
  init/NAME                  init-once's lock of NAME
  sweeper/...                the TTL sweeper's state (and the lock older versions took)

Environment (the account: a connection string, or an endpoint with an Entra ID token):
  LEASEGATE_CONNECTION_STRING   storage connection string, key or SAS (default, when neither
                                it nor LEASEGATE_BLOB_ENDPOINT is set: UseDevelopmentStorage=true)
  LEASEGATE_BLOB_ENDPOINT       https://ACCOUNT.blob.core.windows.net (or path style
                                https://HOST:PORT/ACCOUNT), with one of:
    LEASEGATE_ACCESS_TOKEN        a token, as printed by: az account get-access-token
                                  --resource https://storage.azure.com/ --query accessToken -o tsv
    LEASEGATE_TENANT_ID, LEASEGATE_CLIENT_ID, LEASEGATE_CLIENT_SECRET
                                  a service principal's client secret (one token request
                                  per command); LEASEGATE_AUTHORITY, default
                                  https://login.microsoftonline.com
                                the identity needs Storage Blob Data Contributor on the container
  LEASEGATE_HOLDER_KEY          secret that --holder lease ids are keyed with (required with
                                --holder; never derived from the storage credential)

Exit status: 0 done, 1 failed (storage, the app, the environment), 2 a usage error.";

/// Shown after `status`'s options: what it reads beside the account.
const STATUS_ENVIRONMENT: &str = "\
Environment (beside the account's, see leasegate --help):
  LEASEGATE_PROGRESS_MS         a listing that takes longer prints a progress line on stderr
                                this often (default 1000; 0: after every page)
  LEASEGATE_APP_URL             the app's base URL when --app is not given
  LEASEGATE_TIMER_TOKEN         the app's timer_token (its admin_token works too); sent only
                                over https, or over http to this machine (127.0.0.0/8, ::1,
                                localhost): any other URL is refused before a request.
                                status JOB needs no storage account.";

/// Take, show, release and break leasegate's locks from a terminal.
#[derive(Parser)]
#[command(name = "leasegate", version, after_help = LOCKS_AND_ENVIRONMENT)]
#[command(arg_required_else_help = true)]
struct Cli {
    /// Container of the lock blobs
    #[arg(long, global = true, value_name = "NAME", default_value = "leasegate",
          value_parser = container_name)]
    container: ContainerName,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Take LOCK (or extend it: same holder or id)
    Acquire {
        /// The lock's path in the container (see leasegate --help)
        #[arg(value_parser = lock_name)]
        lock: LockName,
        /// The window, in seconds: 15 to 60 a native blob lease, any other a lease record
        #[arg(long, value_name = "SECS", default_value = "30", allow_hyphen_values = true,
              value_parser = window)]
        window: Term,
        /// Acquire with the lease id derived from NAME (needs LEASEGATE_HOLDER_KEY)
        #[arg(long, value_name = "NAME", conflicts_with = "lease_id")]
        holder: Option<String>,
        /// Acquire with this lease id (a GUID)
        #[arg(long, value_name = "ID", value_parser = lease_id)]
        lease_id: Option<LeaseId>,
    },
    /// Show LOCK's state and fencing token
    Show {
        /// The lock's path in the container (see leasegate --help)
        #[arg(value_parser = lock_name)]
        lock: LockName,
    },
    /// Give LOCK up (safe to repeat)
    Release {
        /// The lock's path in the container (see leasegate --help)
        #[arg(value_parser = lock_name)]
        lock: LockName,
        /// The lease id that holds it
        #[arg(long, value_name = "ID", value_parser = lease_id)]
        lease_id: LeaseId,
    },
    /// End whoever holds LOCK
    Break {
        /// The lock's path in the container (see leasegate --help)
        #[arg(value_parser = lock_name)]
        lock: LockName,
    },
    /// End any lease and delete LOCK's blob (a lock answered lock_unusable)
    ///
    /// Tokens stay increasing: a lock blob created again starts above every token the old one
    /// issued.
    Delete {
        /// The lock's path in the container (see leasegate --help)
        #[arg(value_parser = lock_name)]
        lock: LockName,
    },
    /// Acquire, contend, extend, release, show (a lock demo/nightly-job)
    Demo,
    /// The app's container from storage, or (status JOB) a job from the app
    ///
    /// Without JOB: the app's container, read from storage: each leader group's leader and
    /// term, each job's last runs and reservations (and, from the app when its URL is given,
    /// next runs), held gates (count, longest-held), the TTL sweeper's passes and progress.
    /// Long listings print progress lines on stderr.
    ///
    /// With JOB: ask the scheduled-job app about JOB (GET /api/jobs/JOB): schedule, next
    /// runs, paused or not, policies, counters, last runs.
    #[command(after_help = STATUS_ENVIRONMENT)]
    Status {
        /// A job of the scheduled-job app (none: the container's view, from storage)
        job: Option<String>,
        /// The app's base URL, e.g. http://127.0.0.1:3000 (default: LEASEGATE_APP_URL);
        /// /api/jobs/JOB is appended (without JOB: for each job found in the container, for
        /// its next runs)
        #[arg(long, value_name = "URL")]
        app: Option<String>,
        /// Print JSON (the shape in docs/functions.md; with JOB: the app's answer as it came)
        #[arg(long)]
        json: bool,
        /// Blobs per listing request, 1 to 5000 (default 5000; without JOB only)
        #[arg(long, value_name = "N", conflicts_with = "job", value_parser = page_size)]
        page_size: Option<u32>,
    },
}

fn container_name(s: &str) -> Result<ContainerName, String> {
    ContainerName::try_new(s).map_err(|e| e.to_string())
}

fn lock_name(s: &str) -> Result<LockName, String> {
    LockName::try_new(s).map_err(|e| e.to_string())
}

fn lease_id(s: &str) -> Result<LeaseId, String> {
    LeaseId::try_new(s).map_err(|e| e.to_string())
}

fn window(s: &str) -> Result<Term, String> {
    let secs: u64 = s
        .parse()
        .map_err(|_| "--window takes whole seconds".to_string())?;
    Term::for_window(Duration::from_secs(secs)).map_err(|e| e.to_string())
}

fn page_size(s: &str) -> Result<u32, String> {
    s.parse()
        .ok()
        .filter(|n| (1..=overview::MAX_PAGE).contains(n))
        .ok_or_else(|| "--page-size takes 1 to 5000 (blobs)".to_string())
}

/// The purpose `--holder` ids are derived for: no function's id is ever the same.
const HOLDER_PURPOSE: &str = "cli";

fn main() -> ExitCode {
    // A usage error exits 2 naming the argument, help and the version exit 0 (clap's rules).
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("leasegate: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let transport = NativeTransport::default();
    // Locks are named by their path in the container: no prefix of the CLI's own.
    let locks = || -> Result<Locks<&NativeTransport>, String> {
        let account = environment::account(environment::process_var)?;
        Ok(Locks::new(&transport, account, cli.container.clone()).with_prefix(""))
    };
    match cli.command {
        Command::Acquire {
            lock,
            window,
            holder,
            lease_id,
        } => {
            let locks = locks()?;
            // A random id is given back after a failure that may have granted it; a derived or
            // given one is left (acquire again with it to settle the state).
            let (id, origin) = match (holder, lease_id) {
                (Some(h), _) => (
                    LeaseId::for_holder(&holder_key()?, HOLDER_PURPOSE, &h, &lock),
                    IdOrigin::Known,
                ),
                (None, Some(id)) => (id, IdOrigin::Known),
                (None, None) => (
                    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes()),
                    IdOrigin::Fresh,
                ),
            };
            acquire_with(&locks, &lock, window, id, origin)
        }
        Command::Show { lock } => show(&locks()?, &lock),
        Command::Release { lock, lease_id } => {
            let locks = locks()?;
            let released = block_on(locks.release(&lock, lease_id, Start::Read, SystemTime::now()))
                .map(|(r, _)| r)
                .map_err(explain(locks.account()))?;
            println!(
                "{}",
                if released == Release::Released {
                    "released"
                } else {
                    "not held (nothing to do)"
                }
            );
            Ok(())
        }
        Command::Break { lock } => {
            let locks = locks()?;
            block_on(locks.break_lock(&lock, 0, SystemTime::now()))
                .map_err(explain(locks.account()))?;
            println!("broken");
            Ok(())
        }
        Command::Delete { lock } => delete(&locks()?, &lock),
        Command::Demo => demo(
            &locks()?,
            &HolderKey::try_new(b"leasegate demo").map_err(|e| e.to_string())?,
        ),
        Command::Status {
            job: Some(job),
            app,
            json,
            ..
        } => {
            print!(
                "{}",
                status::run(&job, app.as_deref(), json, environment::process_var)?
            );
            Ok(())
        }
        // No job: the container's view, from storage.
        Command::Status {
            job: None,
            app,
            json,
            page_size,
        } => container_status(cli.container.clone(), app.as_deref(), json, page_size),
    }
}

/// The key `--holder` lease ids are derived with: `LEASEGATE_HOLDER_KEY`.
fn holder_key() -> Result<HolderKey, String> {
    match std::env::var("LEASEGATE_HOLDER_KEY") {
        Ok(secret) if !secret.is_empty() => {
            HolderKey::try_new(secret.as_bytes()).map_err(|e| e.to_string())
        }
        _ => Err(
            "--holder needs LEASEGATE_HOLDER_KEY (the secret its lease ids are keyed \
                  with); or pass --lease-id ID"
                .to_string(),
        ),
    }
}

/// `delete`: ends any lease at once (whoever holds an unusable lock cannot be trusted to give
/// it back), then deletes the lock blob. A lock blob created again starts above every token the
/// old one issued (the fencing rule), so deleting never lets a token go back.
fn delete(locks: &Locks<&NativeTransport>, lock: &LockName) -> Result<(), String> {
    let fail = explain(locks.account());
    let blob = locks.blob_name(lock).map_err(|e| e.to_string())?;
    let now = SystemTime::now();
    let _ = block_on(locks.client().execute(
        &Lease::new(
            locks.container().clone(),
            blob.clone(),
            LeaseAction::Break { period: Some(0) },
        ),
        now,
    ));
    let delete = DeleteBlob {
        container: locks.container().clone(),
        blob,
        lease_id: None,
        condition: Condition::None,
    };
    match block_on(locks.client().execute(&delete, now)).map_err(&fail)? {
        (DeleteOutcome::Deleted, _) => println!("deleted"),
        (DeleteOutcome::NotFound, _) => println!("no such lock blob (nothing to do)"),
        (DeleteOutcome::Refused(r), _) => return Err(format!("storage refused the delete: {r:?}")),
    }
    Ok(())
}

/// `status` without a job: the container's leaders, jobs, gates and sweeper, from storage.
fn container_status(
    container: ContainerName,
    app: Option<&str>,
    json: bool,
    page_size: Option<u32>,
) -> Result<(), String> {
    let account = environment::account(environment::process_var)?;
    let every = overview::progress_every(environment::process_var)?;
    let transport = NativeTransport::default();
    let blobs = BlobClient::new(&transport, account, container);
    let fail = explain(blobs.account());
    // Progress goes to stderr only: stdout holds the table or the JSON, nothing else.
    let mut progress = overview::Progress::new(every, |line| eprintln!("{line}"));
    let mut view = block_on(overview::gather(
        &blobs,
        page_size.unwrap_or(overview::MAX_PAGE),
        &mut progress,
        &fail,
        SystemTime::now(),
    ))?;
    // The schedules live in the app, not in the container: asked only where it is named.
    if app.is_some() || environment::process_var(status::APP_URL)?.is_some() {
        overview::add_next(&mut view, |job| {
            status::fetch(job, app, environment::process_var)
        });
    }
    if json {
        let text = serde_json::to_string_pretty(&view).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", overview::format_overview(&view));
    }
    Ok(())
}

fn acquire(
    locks: &Locks<&NativeTransport>,
    lock: &LockName,
    term: Term,
    id: LeaseId,
) -> Result<(), String> {
    acquire_with(locks, lock, term, id, IdOrigin::Known)
}

fn acquire_with(
    locks: &Locks<&NativeTransport>,
    lock: &LockName,
    term: Term,
    id: LeaseId,
    origin: IdOrigin,
) -> Result<(), String> {
    let counting = Counting::new(locks.transport());
    let counted = Locks::new(
        &counting,
        locks.account().clone(),
        locks.container().clone(),
    )
    .with_prefix("");
    let outcome = block_on(counted.acquire(
        lock,
        Acquiring::new(term, id).origin(origin),
        SystemTime::now(),
    ))
    .map_err(explain(locks.account()))?;
    match outcome {
        Acquire::Acquired(a) => println!(
            "{} {lock}: lease id {}, fencing token {}, expires {}, {} request(s)",
            if a.extended { "extended" } else { "acquired" },
            a.lease_id,
            a.fencing_token.map_or("-".into(), |t| t.to_string()),
            a.expires_at.map_or("never".into(), rfc3339),
            counting.sent()
        ),
        Acquire::Busy { retry_after, .. } => println!(
            "busy: {lock} is held by someone else{}, {} request(s)",
            retry_after.map_or(String::new(), |d| format!(" for {}s more", d.as_secs())),
            counting.sent()
        ),
    }
    Ok(())
}

fn show(locks: &Locks<&NativeTransport>, lock: &LockName) -> Result<(), String> {
    let info =
        block_on(locks.inspect(lock, SystemTime::now())).map_err(explain(locks.account()))?;
    let status = match info.status {
        LockStatus::Available => "available".to_string(),
        LockStatus::Held {
            expires_at,
            holder,
            since,
            label,
        } => format!(
            "held{}{}{}",
            holder.map_or(String::new(), |h| if label.is_empty() {
                format!(" by {h}")
            } else {
                format!(" by {label} ({h})")
            }),
            since.map_or(String::new(), |t| format!(" since {}", rfc3339(t))),
            expires_at.map_or(String::new(), |t| format!(" until {}", rfc3339(t)))
        ),
    };
    println!(
        "{lock}: {status}; blob lease state {}; fencing token {}",
        info.lease_state
            .map_or("none (no blob yet)".into(), |s| format!("{s:?}")
                .to_lowercase()),
        info.fencing_token
    );
    Ok(())
}

fn demo(locks: &Locks<&NativeTransport>, key: &HolderKey) -> Result<(), String> {
    let lock = LockName::try_new("demo/nightly-job").map_err(|e| e.to_string())?;
    let term = Term::for_window(Duration::from_secs(15)).map_err(|e| e.to_string())?;
    let a = LeaseId::for_holder(key, HOLDER_PURPOSE, "node-a", &lock);
    let b = LeaseId::for_holder(key, HOLDER_PURPOSE, "node-b", &lock);
    println!("node-a takes the lock:");
    acquire(locks, &lock, term, a)?;
    show(locks, &lock)?;
    println!("node-b tries while node-a holds it:");
    acquire(locks, &lock, term, b)?;
    println!("node-a acquires again on its next invocation (extends, same token):");
    acquire(locks, &lock, term, a)?;
    println!("node-a releases; node-b takes over:");
    block_on(locks.release(&lock, a, Start::Read, SystemTime::now()))
        .map(|(r, _)| r)
        .map_err(explain(locks.account()))?;
    acquire(locks, &lock, term, b)?;
    show(locks, &lock)?;
    block_on(locks.release(&lock, b, Start::Read, SystemTime::now()))
        .map(|(r, _)| r)
        .map_err(explain(locks.account()))?;
    show(locks, &lock)?;
    Ok(())
}

use leasegate::time::rfc3339;
