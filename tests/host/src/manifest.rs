//! Reads a Spin manifest (version 2) the way Spin does for what this host serves: application
//! variables (defaults, overrides, `SPIN_VARIABLE_*`), HTTP triggers, cron triggers (the
//! `trigger-cron` plugin's `[[trigger.cron]]`), and each component's source,
//! `allowed_outbound_hosts` and variables, with `{{ name }}` templates expanded.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct RawManifest {
    spin_manifest_version: u32,
    #[serde(default)]
    variables: BTreeMap<String, RawVariable>,
    #[serde(default)]
    trigger: RawTriggers,
    #[serde(default)]
    component: BTreeMap<String, RawComponent>,
}

#[derive(Debug, Deserialize)]
struct RawVariable {
    default: Option<String>,
    #[serde(default)]
    required: bool,
    #[serde(default)]
    secret: bool,
}

#[derive(Debug, Default, Deserialize)]
struct RawTriggers {
    #[serde(default)]
    http: Vec<RawHttpTrigger>,
    #[serde(default)]
    cron: Vec<RawCronTrigger>,
}

/// `[[trigger.cron]]`, as the plugin reads it (unknown fields refused, like its
/// `deny_unknown_fields`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCronTrigger {
    component: String,
    cron_expression: String,
}

#[derive(Debug, Deserialize)]
struct RawHttpTrigger {
    route: String,
    component: String,
}

#[derive(Debug, Deserialize)]
struct RawComponent {
    source: String,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    #[serde(default)]
    key_value_stores: Vec<String>,
    #[serde(default)]
    variables: BTreeMap<String, String>,
}

/// An HTTP route: exact (`/api/telemetry`) or a trailing wildcard (`/api/gate/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Matches this path only.
    Exact(String),
    /// Matches this prefix and everything below it.
    Wildcard(String),
}

impl Route {
    fn parse(route: &str) -> Result<Route> {
        if !route.starts_with('/') {
            bail!("route {route:?} must start with '/'");
        }
        Ok(match route.strip_suffix("/...") {
            Some(base) => Route::Wildcard(base.to_string()),
            None if route == "/..." => Route::Wildcard(String::new()),
            None => Route::Exact(route.trim_end_matches('/').to_string()),
        })
    }

    /// The path info below the route for `path`, if the route matches it.
    pub fn matches(&self, path: &str) -> Option<String> {
        match self {
            Route::Exact(p) => (path.trim_end_matches('/') == p).then(String::new),
            Route::Wildcard(base) => {
                let rest = path.strip_prefix(base.as_str())?;
                (rest.is_empty() || rest.starts_with('/')).then(|| rest.to_string())
            }
        }
    }

    /// The route as written in the manifest.
    pub fn as_written(&self) -> String {
        match self {
            Route::Exact(p) => p.clone(),
            Route::Wildcard(b) => format!("{b}/..."),
        }
    }

    fn specificity(&self) -> (usize, usize) {
        match self {
            Route::Exact(p) => (1, p.len()),
            Route::Wildcard(b) => (0, b.len()),
        }
    }
}

/// One `[[trigger.cron]]`: a component run on a schedule.
#[derive(Debug, Clone)]
pub struct CronTrigger {
    /// The component to run.
    pub component: String,
    /// `cron_expression` as written: `sec min hour dom mon dow [year]`.
    pub expression: String,
    /// The parsed schedule (UTC).
    pub schedule: cron::Schedule,
}

impl CronTrigger {
    /// Parses `expression` (six fields with seconds, or seven with a year, as the plugin takes).
    pub fn parse(component: &str, expression: &str) -> Result<CronTrigger> {
        let fields = expression.split_whitespace().count();
        if !(6..=7).contains(&fields) {
            bail!(
                "cron_expression {expression:?} has {fields} fields: it takes six or seven \
                 (sec min hour dom mon dow [year])"
            );
        }
        let schedule = cron::Schedule::from_str(expression)
            .map_err(|e| anyhow!("cron_expression {expression:?}: {e}"))?;
        Ok(CronTrigger {
            component: component.to_string(),
            expression: expression.to_string(),
            schedule,
        })
    }

    /// The first scheduled time strictly after `after` (time since the Unix epoch), in whole
    /// Unix seconds; `None` when the schedule has no more occurrences.
    pub fn next_after(&self, after: Duration) -> Option<u64> {
        let secs = i64::try_from(after.as_secs()).ok()?;
        let start = chrono::DateTime::from_timestamp(secs, after.subsec_nanos())?;
        let next = self.schedule.after(&start).next()?;
        u64::try_from(next.timestamp()).ok()
    }
}

/// One component, ready to serve.
#[derive(Debug, Clone)]
pub struct ComponentConfig {
    /// Its id in the manifest.
    pub id: String,
    /// The `.wasm` file.
    pub source: PathBuf,
    /// Allowed outbound origins, templates expanded (`scheme://host[:port]`, `*` allowed).
    pub allowed_outbound_hosts: Vec<String>,
    /// The key-value stores it may open (`default` is the only store the host has, as in Spin
    /// without a runtime configuration).
    pub key_value_stores: Vec<String>,
    /// Component variables, templates expanded.
    pub variables: HashMap<String, String>,
}

/// What a manifest resolves to.
#[derive(Debug, Clone)]
pub struct App {
    /// Routes, most specific first (none when the manifest has no `[[trigger.http]]`).
    pub routes: Vec<(Route, String)>,
    /// Cron triggers, in manifest order.
    pub cron: Vec<CronTrigger>,
    /// Components by id.
    pub components: BTreeMap<String, ComponentConfig>,
    /// Names of the application variables marked secret (never printed).
    pub secret_variables: Vec<String>,
}

/// Resolves the manifest at `path` with variable `overrides` (then `SPIN_VARIABLE_*`, then
/// defaults).
pub fn load(path: &Path, overrides: &HashMap<String, String>) -> Result<App> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the manifest {}", path.display()))?;
    let raw: RawManifest = toml::from_str(&text)
        .with_context(|| format!("parsing the manifest {}", path.display()))?;
    if raw.spin_manifest_version != 2 {
        bail!("only spin_manifest_version = 2 is supported");
    }
    let base = path.parent().unwrap_or(Path::new("."));

    for name in overrides.keys() {
        if !raw.variables.contains_key(name) {
            bail!("variable {name} is not declared in the manifest's [variables]");
        }
    }
    let mut values = HashMap::new();
    for (name, decl) in &raw.variables {
        check_variable_name(name)?;
        let env = std::env::var(format!("SPIN_VARIABLE_{}", name.to_ascii_uppercase())).ok();
        let value = overrides
            .get(name)
            .cloned()
            .or(env)
            .or_else(|| decl.default.clone());
        match value {
            Some(v) => {
                values.insert(name.clone(), v);
            }
            None if decl.required => bail!("variable {name} is required and has no value"),
            None => {}
        }
    }

    let mut components = BTreeMap::new();
    for (id, c) in &raw.component {
        let mut variables = HashMap::new();
        for (name, template) in &c.variables {
            check_variable_name(name)?;
            variables.insert(
                name.clone(),
                expand(template, &values)
                    .with_context(|| format!("component {id}, variable {name}"))?,
            );
        }
        let mut allowed = Vec::new();
        for template in &c.allowed_outbound_hosts {
            let host = expand(template, &values)
                .with_context(|| format!("component {id}, allowed_outbound_hosts"))?;
            check_allowed_host(&host).with_context(|| format!("component {id}"))?;
            allowed.push(host.trim_end_matches('/').to_string());
        }
        for label in &c.key_value_stores {
            if label != "default" {
                bail!(
                    "component {id}: key_value_stores names {label:?}, which no runtime configuration defines (only \"default\" exists)"
                );
            }
        }
        components.insert(
            id.clone(),
            ComponentConfig {
                id: id.clone(),
                source: base.join(&c.source),
                allowed_outbound_hosts: allowed,
                key_value_stores: c.key_value_stores.clone(),
                variables,
            },
        );
    }
    let mut routes = Vec::new();
    for t in &raw.trigger.http {
        if !components.contains_key(&t.component) {
            bail!(
                "route {} names an unknown component {}",
                t.route,
                t.component
            );
        }
        routes.push((Route::parse(&t.route)?, t.component.clone()));
    }
    routes.sort_by_key(|(r, _)| std::cmp::Reverse(r.specificity()));
    let mut cron = Vec::new();
    for (i, t) in raw.trigger.cron.iter().enumerate() {
        let entry = || {
            format!(
                "[[trigger.cron]] #{} (component {}, cron_expression {:?})",
                i + 1,
                t.component,
                t.cron_expression
            )
        };
        if !components.contains_key(&t.component) {
            bail!("{} names an unknown component {}", entry(), t.component);
        }
        cron.push(CronTrigger::parse(&t.component, &t.cron_expression).with_context(entry)?);
    }
    Ok(App {
        routes,
        cron,
        components,
        secret_variables: raw
            .variables
            .iter()
            .filter(|(_, d)| d.secret)
            .map(|(n, _)| n.clone())
            .collect(),
    })
}

fn check_variable_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "variable name {name:?}: lowercase letters, digits and '_' only"
        ))
    }
}

/// Expands `{{ name }}` templates.
fn expand(template: &str, values: &HashMap<String, String>) -> Result<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| anyhow!("unclosed '{{{{' in template"))?;
        let name = after[..end].trim();
        let value = values
            .get(name)
            .ok_or_else(|| anyhow!("template names variable {name}, which has no value"))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `scheme://host[:port]`, no path, as Spin requires.
fn check_allowed_host(host: &str) -> Result<()> {
    let (scheme, rest) = host
        .split_once("://")
        .ok_or_else(|| anyhow!("allowed outbound host {host:?} has no scheme"))?;
    if scheme.is_empty() || rest.is_empty() {
        bail!("allowed outbound host {host:?} is incomplete");
    }
    if rest.trim_end_matches('/').contains('/') {
        bail!("allowed outbound host {host:?} has a path: only scheme://host[:port] is allowed");
    }
    Ok(())
}

/// Whether `allowed` (expanded `allowed_outbound_hosts`) lets a request to `scheme://authority`
/// out. Spin's defaults apply: no port means the scheme's default port; `*` matches any scheme
/// or host.
pub fn is_allowed(allowed: &[String], scheme: &str, authority: &str) -> bool {
    let (host, port) = split_authority(authority, scheme);
    allowed.iter().any(|a| {
        let Some((s, rest)) = a.split_once("://") else {
            return false;
        };
        let (h, p) = split_authority(rest, s);
        (s == "*" || s.eq_ignore_ascii_case(scheme))
            && (h == "*" || h.eq_ignore_ascii_case(&host))
            && (p == "*" || p == port)
    })
}

fn split_authority(authority: &str, scheme: &str) -> (String, String) {
    let default_port = match scheme {
        "https" => "443",
        _ => "80",
    };
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h.to_string(), p.to_string())
        }
        _ => (authority.to_string(), default_port.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_like_spin() {
        let w = Route::parse("/api/gate/...").unwrap();
        assert_eq!(w.matches("/api/gate/abc"), Some("/abc".into()));
        assert_eq!(w.matches("/api/gate"), Some(String::new()));
        assert_eq!(w.matches("/api/gateway"), None);
        let e = Route::parse("/api/telemetry").unwrap();
        assert_eq!(e.matches("/api/telemetry"), Some(String::new()));
        assert_eq!(e.matches("/api/telemetry/x"), None);
    }

    #[test]
    fn templates_and_hosts() {
        let values = HashMap::from([("o".to_string(), "http://127.0.0.1:1".to_string())]);
        assert_eq!(
            expand("{{ o }}/x", &values).unwrap(),
            "http://127.0.0.1:1/x"
        );
        assert!(expand("{{ missing }}", &values).is_err());
        assert!(check_allowed_host("http://h:1/path").is_err());
        let allowed = vec!["http://127.0.0.1:10000".to_string()];
        assert!(is_allowed(&allowed, "http", "127.0.0.1:10000"));
        assert!(!is_allowed(&allowed, "http", "127.0.0.1:10001"));
        assert!(!is_allowed(&allowed, "https", "127.0.0.1:10000"));
        assert!(is_allowed(
            &["https://x.example".into()],
            "https",
            "x.example"
        ));
    }

    #[test]
    fn cron_expressions() {
        let every_two = CronTrigger::parse("c", "*/2 * * * * *").unwrap();
        assert_eq!(
            every_two.next_after(Duration::from_millis(1_000_000_500)),
            Some(1_000_002)
        );
        assert_eq!(
            every_two.next_after(Duration::from_secs(1_000_002)),
            Some(1_000_004)
        );
        let with_year = CronTrigger::parse("c", "0 0 0 1 1 * 2099").unwrap();
        assert_eq!(
            with_year.next_after(Duration::from_secs(0)),
            Some(4_070_908_800)
        );
        assert!(with_year
            .next_after(Duration::from_secs(4_070_908_800))
            .is_none());
        for bad in [
            "* * * * *",
            "*/2 * * * * * * *",
            "61 * * * * *",
            "nonsense",
            "",
        ] {
            let e = CronTrigger::parse("c", bad).unwrap_err();
            assert!(format!("{e:#}").contains(&format!("{bad:?}")), "{e:#}");
        }
    }
}
