//! The jobs one component runs: the `jobs` variable (TOML text, one table per job, each key a
//! `job_*` setting without its prefix), or, with `jobs` empty, the one job the `job_*`
//! variables name (`job_name`). See `docs/timer-functions.md` ("Many jobs").

use leasegate_spin::config::{self, ConfigError, Variables};
use leasegate_spin::timer;
use std::collections::BTreeMap;

use crate::settings::{check_job_name, Settings};

/// The keys a job's table may hold: today's `job_*` variables without the prefix.
pub const KEYS: &[&str] = &[
    "schedule",
    "time_zone",
    "period_seconds",
    "offset_seconds",
    "catch_up",
    "catch_up_window_seconds",
    "retries",
    "retry_delay_seconds",
    "timeout_seconds",
    "overlap",
    "retention_seconds",
    "early_seconds",
    "origin",
    "path",
];

/// The component's jobs, in the order the table names them.
#[derive(Debug, Clone)]
pub struct Jobs {
    /// Whether they come from the `jobs` table (`false`: the one job of `job_name`).
    pub table: bool,
    /// Each job: its name and its settings, or why they cannot be used.
    pub jobs: Vec<Job>,
}

/// One job of [`Jobs`].
#[derive(Debug, Clone)]
pub struct Job {
    /// Its name.
    pub name: String,
    /// Its settings, or why they cannot be used (the other jobs run).
    pub settings: Result<Settings, ConfigError>,
}

impl Jobs {
    /// Reads the jobs. `Err` only when none can run: the `jobs` text is not TOML, names no
    /// job, or (with `jobs` empty) the one job's settings cannot be used. A job whose table is
    /// wrong is kept with its error, so that the others run.
    pub fn load(vars: &dyn Variables) -> Result<Jobs, ConfigError> {
        let Some(text) = config::var(vars, "jobs") else {
            let settings = Settings::load(vars)?;
            return Ok(Jobs {
                table: false,
                jobs: vec![Job {
                    name: settings.job.clone(),
                    settings: Ok(settings),
                }],
            });
        };
        // What every job shares is checked once, and named as the app's.
        timer::instance_id(vars)?;
        config::storage(vars)?;
        let parsed: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e.span().map_or(1, |s| {
                let before = text.get(..s.start).unwrap_or(&text);
                before.lines().count().max(1)
            });
            ConfigError(format!(
                "variable jobs is not TOML (one table per job, `[name]` then its keys): line \
                 {line}: {}",
                e.message()
            ))
        })?;
        if parsed.is_empty() {
            return Err(ConfigError(
                "variable jobs names no job: write one table per job, `[name]` then its keys"
                    .into(),
            ));
        }
        let jobs = parsed
            .iter()
            .map(|(name, value)| Job {
                name: name.clone(),
                settings: job_settings(vars, name, value),
            })
            .collect();
        Ok(Jobs { table: true, jobs })
    }

    /// The one job of the `job_*` variables (no `jobs` table).
    pub fn single(&self) -> Option<&Settings> {
        match self.jobs.as_slice() {
            [Job {
                settings: Ok(s), ..
            }] if !self.table => Some(s),
            _ => None,
        }
    }

    /// The job named `name`.
    pub fn get(&self, name: &str) -> Option<&Job> {
        self.jobs.iter().find(|j| j.name == name)
    }

    /// The names, comma-separated (for a message).
    pub fn names(&self) -> String {
        self.jobs
            .iter()
            .map(|j| j.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The settings of the job `name` whose table is `value`: its keys over the app-wide `job_*`
/// variables, then the defaults.
fn job_settings(
    vars: &dyn Variables,
    name: &str,
    value: &toml::Value,
) -> Result<Settings, ConfigError> {
    let about = |m: String| ConfigError(format!("variable jobs, job {name}: {m}"));
    check_job_name(name).map_err(about)?;
    let toml::Value::Table(table) = value else {
        return Err(about(format!(
            "`{name} = ...` is not a table: each job is a table, `[{name}]` then its keys"
        )));
    };
    let mut keys = BTreeMap::new();
    for (key, value) in table {
        if !KEYS.contains(&key.as_str()) {
            return Err(about(format!(
                "unknown key {key} (the keys: {})",
                KEYS.join(", ")
            )));
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            _ => {
                return Err(about(format!(
                    "key {key} must be a string or a number, not {}",
                    value.type_str()
                )))
            }
        };
        keys.insert(key.clone(), text);
    }
    if keys.get("path").is_some_and(|p| !p.starts_with('/')) {
        return Err(about("key path must start with /".into()));
    }
    let overlay = Overlay {
        base: vars,
        job: name,
        keys: &keys,
    };
    Settings::load(&overlay).map_err(|e| about(renamed(&e.0, &keys)))
}

/// A job's variables: its table's keys as `job_*` variables over the app's.
struct Overlay<'a> {
    base: &'a dyn Variables,
    job: &'a str,
    keys: &'a BTreeMap<String, String>,
}

impl Variables for Overlay<'_> {
    fn get(&self, name: &str) -> Option<String> {
        if name == "job_name" {
            return Some(self.job.to_string());
        }
        if name == "job_url" {
            return self.url();
        }
        if let Some(value) = name.strip_prefix("job_").and_then(|k| self.keys.get(k)) {
            return Some(value.clone());
        }
        // A table that gives its job a schedule of one kind sets aside the app-wide variables
        // of the other kind (a job has one schedule).
        let set = |k: &str| self.keys.contains_key(k);
        let interval = set("period_seconds") || set("offset_seconds");
        match name {
            "job_period_seconds" | "job_offset_seconds" if set("schedule") => None,
            "job_schedule" | "job_time_zone" if interval => None,
            _ => self.base.get(name),
        }
    }
}

impl Overlay<'_> {
    /// Where the job is POSTed: its `origin` and `path`, each else the app's `job_origin` and
    /// `job_path` (else the parts of `job_url`); the app's `job_url` when the table sets
    /// neither.
    fn url(&self) -> Option<String> {
        let base_url = config::var(self.base, "job_url");
        let (origin, path) = (self.keys.get("origin"), self.keys.get("path"));
        if origin.is_none() && path.is_none() {
            if let Some(url) = base_url {
                return Some(url);
            }
        }
        let (url_origin, url_path) = base_url.as_deref().map(split_url).unzip();
        let origin = origin
            .cloned()
            .or_else(|| config::var(self.base, "job_origin"))
            .or(url_origin)?;
        // The table's own path is the job's whole path and query. The app's (`job_path`, else
        // `job_url`'s) keeps its query (a function key, `?code=...`) only at the app's origin.
        let path = match path {
            Some(path) => path.clone(),
            None => {
                let app_path = config::var(self.base, "job_path")
                    .or(url_path)
                    .unwrap_or_default();
                match self.keys.contains_key("origin") {
                    true => {
                        app_path[..app_path.find(['?', '#']).unwrap_or(app_path.len())].to_string()
                    }
                    false => app_path,
                }
            }
        };
        Some(format!("{}{path}", origin.trim_end_matches('/')))
    }
}

/// A URL's origin and path (`http://h:1/a/b` is `http://h:1` and `/a/b`).
fn split_url(url: &str) -> (String, String) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => (
            url[..after_scheme + i].to_string(),
            url[after_scheme + i..].to_string(),
        ),
        None => (url.to_string(), String::new()),
    }
}

/// A settings error about the job's variables, said of the keys its table set: `variable
/// job_schedule: ...` becomes `key schedule: ...` where the table set `schedule` (a value the
/// job took from an app-wide variable keeps that variable's name).
fn renamed(message: &str, keys: &BTreeMap<String, String>) -> String {
    let mut m = message.to_string();
    if keys.contains_key("origin") || keys.contains_key("path") {
        m = m.replace("variable job_url", "keys origin and path (the job's URL)");
    }
    // Longest first: `job_catch_up_window_seconds` before `job_catch_up`.
    let mut set: Vec<&String> = keys.keys().collect();
    set.sort_by_key(|k| std::cmp::Reverse(k.len()));
    for key in set {
        m = replace_name(&m, &format!("variables job_{key}"), &format!("keys {key}"));
        m = replace_name(&m, &format!("variable job_{key}"), &format!("key {key}"));
        m = replace_name(&m, &format!("job_{key}"), key);
    }
    m
}

/// `text` with each `from` that is a whole name (not the start of a longer one:
/// `job_catch_up` in `job_catch_up_window_seconds`) replaced by `to`.
fn replace_name(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        let whole = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(extra: &[(&str, &str)]) -> HashMap<String, String> {
        [
            ("instance_id", "node-u"),
            ("job_origin", "http://127.0.0.1:3001"),
            ("job_path", "/job"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::DEV_ACCOUNT_KEY),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    const TWO: &str = r#"
[invoice-export]
schedule = "30 6 * * MON-FRI"
time_zone = "Europe/Berlin"
path = "/invoices/export"

[fast-sync]
schedule = "*/10 * * * * *"
retries = 2
"#;

    #[test]
    fn each_table_is_a_job_over_the_app_wide_variables() {
        let jobs = Jobs::load(&vars(&[("jobs", TWO), ("job_retries", "1")])).unwrap();
        assert!(jobs.table);
        assert_eq!(jobs.names(), "fast-sync, invoice-export");
        let invoice = jobs
            .get("invoice-export")
            .unwrap()
            .settings
            .as_ref()
            .unwrap();
        assert_eq!(invoice.job, "invoice-export");
        assert_eq!(invoice.job_url, "http://127.0.0.1:3001/invoices/export");
        assert_eq!(invoice.schedule.expression(), "30 6 * * MON-FRI");
        assert_eq!(invoice.retries, 1, "the app-wide job_retries");
        let sync = jobs.get("fast-sync").unwrap().settings.as_ref().unwrap();
        assert_eq!(sync.retries, 2, "its own key first");
        assert_eq!(
            sync.job_url, "http://127.0.0.1:3001/job",
            "the app's job_path"
        );
        assert!(jobs.get("job").is_none());
    }

    #[test]
    fn with_jobs_empty_the_single_job_variables_work_as_before() {
        let v = vars(&[
            ("job_name", "nightly"),
            ("job_url", "http://127.0.0.1:9/run"),
        ]);
        let jobs = Jobs::load(&v).unwrap();
        assert!(!jobs.table);
        let only = &jobs.jobs[0];
        assert_eq!(only.name, "nightly");
        assert_eq!(
            only.settings.as_ref().unwrap().job_url,
            "http://127.0.0.1:9/run"
        );
        let broken = vars(&[("job_schedule", "0 61 * * * *")]);
        let e = Jobs::load(&broken).unwrap_err().0;
        assert!(
            e.starts_with("variable job_schedule: field 2 (minute)"),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_table_names_the_job_the_key_and_the_field_and_the_others_run() {
        let text = "[ok]\nperiod_seconds = 60\n[broken]\nschedule = \"0 61 * * * *\"\n";
        let jobs = Jobs::load(&vars(&[("jobs", text)])).unwrap();
        assert!(jobs.get("ok").unwrap().settings.is_ok());
        let e = jobs.get("broken").unwrap().settings.as_ref().unwrap_err();
        assert!(
            e.0.starts_with("variable jobs, job broken: key schedule: field 2 (minute)"),
            "{e}"
        );
        let unknown = Jobs::load(&vars(&[("jobs", "[a]\nschedul = \"* * * * *\"\n")])).unwrap();
        let e = unknown.jobs[0].settings.as_ref().unwrap_err();
        assert!(
            e.0.starts_with("variable jobs, job a: unknown key schedul"),
            "{e}"
        );
        let typed = Jobs::load(&vars(&[("jobs", "[a]\nretries = true\n")])).unwrap();
        let e = typed.jobs[0].settings.as_ref().unwrap_err();
        assert_eq!(
            e.0,
            "variable jobs, job a: key retries must be a string or a number, not boolean"
        );
        let named = Jobs::load(&vars(&[("jobs", "[\"Bad Name\"]\nretries = 1\n")])).unwrap();
        assert!(named.jobs[0].settings.is_err());
        // What every job shares is the app's error, not each job's.
        let mut v = vars(&[("jobs", "[a]\nretries = 1\n")]);
        v.remove("instance_id");
        let e = Jobs::load(&v).unwrap_err().0;
        assert!(e.starts_with("instance_id is not set"), "{e}");
    }

    #[test]
    fn text_that_is_not_a_table_of_jobs_stops_every_job() {
        for (text, says) in [
            ("[a\nretries = 1", "variable jobs is not TOML"),
            ("# nothing yet\n", "variable jobs names no job"),
            (
                "[\"rapport-été\"]\npath = \"/été\"\nschedule = \"ü ü",
                "variable jobs is not TOML (one table per job, `[name]` then its keys): line 3",
            ),
        ] {
            let e = Jobs::load(&vars(&[("jobs", text)])).unwrap_err().0;
            assert!(e.starts_with(says), "{text:?}: {e}");
        }
        let top = Jobs::load(&vars(&[("jobs", "schedule = \"* * * * *\"\n")])).unwrap();
        let e = top.jobs[0].settings.as_ref().unwrap_err();
        assert!(e.0.contains("is not a table"), "{e}");
    }

    #[test]
    fn a_schedule_of_one_kind_sets_aside_the_app_wide_one_of_the_other() {
        let app = [
            ("job_schedule", "0 * * * *"),
            ("job_time_zone", "Europe/Paris"),
        ];
        let text = "[every-90s]\nperiod_seconds = 90\n[hourly]\nretries = 0\n";
        let mut v = vars(&app);
        v.insert("jobs".into(), text.into());
        let jobs = Jobs::load(&v).unwrap();
        let s = jobs.get("every-90s").unwrap().settings.as_ref().unwrap();
        assert_eq!(s.period.as_secs(), 90);
        let h = jobs.get("hourly").unwrap().settings.as_ref().unwrap();
        assert_eq!(h.schedule.expression(), "0 * * * *");
        let text = "[min]\nschedule = \"* * * * *\"\n";
        let mut v = vars(&[("job_period_seconds", "30")]);
        v.insert("jobs".into(), text.into());
        assert!(Jobs::load(&v).unwrap().jobs[0].settings.is_ok());
    }

    #[test]
    fn a_jobs_url_takes_its_origin_and_path_else_the_apps() {
        let text =
            "[a]\norigin = \"http://127.0.0.1:4000/\"\n[b]\npath = \"/b\"\n[c]\npath = \"c\"\n";
        let mut v = vars(&[("job_url", "http://127.0.0.1:9/old")]);
        v.remove("job_origin");
        v.remove("job_path");
        v.insert("jobs".into(), text.into());
        let jobs = Jobs::load(&v).unwrap();
        let url = |n: &str| {
            jobs.get(n)
                .unwrap()
                .settings
                .as_ref()
                .unwrap()
                .job_url
                .clone()
        };
        assert_eq!(url("a"), "http://127.0.0.1:4000/old");
        // The app's URL's query (a credential) does not follow a job to another origin.
        let mut v = vars(&[("job_url", "https://f.example/api/run?code=S3cret")]);
        v.remove("job_origin");
        v.remove("job_path");
        v.insert(
            "jobs".into(),
            "[a]\norigin = \"https://elsewhere.example\"\n".into(),
        );
        let moved = Jobs::load(&v).unwrap();
        let a = &moved.jobs[0].settings.as_ref().unwrap().job_url;
        assert_eq!(a, "https://elsewhere.example/api/run");
        assert_eq!(url("b"), "http://127.0.0.1:9/b");
        let e = jobs.get("c").unwrap().settings.as_ref().unwrap_err();
        assert!(e.0.ends_with("key path must start with /"), "{e}");
        // Nor does the query of `job_path` (spin.toml always sets one), where `job_url` is
        // unset; at the app's origin it stays.
        let mut v = vars(&[("job_path", "/api/run?code=S3cret")]);
        v.insert(
            "jobs".into(),
            "[a]\norigin = \"https://other.example\"\n[b]\nretries = 1\n".into(),
        );
        let jobs = Jobs::load(&v).unwrap();
        let url = |n: &str| {
            jobs.get(n)
                .unwrap()
                .settings
                .as_ref()
                .unwrap()
                .job_url
                .clone()
        };
        assert_eq!(url("a"), "https://other.example/api/run");
        assert_eq!(url("b"), "http://127.0.0.1:3001/api/run?code=S3cret");
    }

    #[test]
    fn an_error_names_the_key_the_table_set_not_a_longer_one() {
        let keys: BTreeMap<String, String> = [("catch_up".to_string(), "all".to_string())].into();
        let m = renamed(
            "variable job_catch_up_window_seconds must be at most 31536000 (job_catch_up is all)",
            &keys,
        );
        assert_eq!(
            m,
            "variable job_catch_up_window_seconds must be at most 31536000 (catch_up is all)"
        );
    }
}
