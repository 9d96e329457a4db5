//! `leasegate status JOB`: what the scheduled-job app says about a job (`GET /api/jobs/{job}`),
//! for a terminal ([`format_status`], in `terminal.rs`, with the helpers the overview's table
//! shares) or as JSON.
//!
//! The app is `--app URL` or `LEASEGATE_APP_URL` (its base URL: `/api/jobs/{job}` is appended);
//! the bearer token is `LEASEGATE_TIMER_TOKEN` (the app's `timer_token`; its `admin_token`
//! works too). The token goes only over https, or over http to this machine (127.0.0.0/8,
//! `::1`, `localhost`): any other URL is refused before a request is made. Redirects are not
//! followed (the token would go with them); a loopback address is reached without a proxy.
//!
//! No token is printed, in an answer or an error. What the app's answer says is printed with
//! control and invisible characters escaped: the terminal shows them, it does not obey them.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use serde_json::Value;

mod terminal;

pub use terminal::format_status;
pub(crate) use terminal::{clean, counters_line, log_entries, paused, runs_table, seconds, text};

/// The app's base URL, when `--app` is not given.
pub const APP_URL: &str = "LEASEGATE_APP_URL";
/// The app's `timer_token` (or `admin_token`).
pub const TIMER_TOKEN: &str = "LEASEGATE_TIMER_TOKEN";
/// How long the whole exchange with the app may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest job name the app accepts (`check_name` in leasegate-spin).
const MAX_JOB: usize = 63;

/// Runs `status JOB`: the text to print (the table, or the app's answer as pretty JSON with
/// `json`), or the error to report. Variables are read through `var` (see
/// [`crate::environment::process_var`]).
pub fn run(
    job: &str,
    app: Option<&str>,
    json: bool,
    var: impl Fn(&str) -> Result<Option<String>, String>,
) -> Result<String, String> {
    let value = fetch(job, app, var)?;
    Ok(if json {
        let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
        text.push('\n');
        text
    } else {
        format_status(&value)
    })
}

/// The app's answer about `job` (`GET /api/jobs/{job}`), or the error to report: what
/// [`run`] prints, and where the container's view (`status` without a job, given the app's
/// URL) takes each job's next occurrences from.
pub fn fetch(
    job: &str,
    app: Option<&str>,
    var: impl Fn(&str) -> Result<Option<String>, String>,
) -> Result<Value, String> {
    check_job(job)?;
    let (raw, source) = match app {
        Some(url) => (url.to_string(), "--app"),
        None => (
            var(APP_URL)?.ok_or_else(|| {
                format!(
                    "status needs the app's URL: --app URL or {APP_URL} \
                     (e.g. http://127.0.0.1:3000)"
                )
            })?,
            APP_URL,
        ),
    };
    // Where the token may go is settled before the token is even read.
    let target = Target::parse(&raw, source)?;
    let token = bearer(var(TIMER_TOKEN)?)?;
    let answer = get(&target, job, &token)?;
    interpret(&target, &answer)
}

/// The app's name rule for jobs: 1 to 63 lowercase letters, digits, `-`, `_` or `.`, starting
/// with a letter or digit.
pub fn check_job(job: &str) -> Result<(), String> {
    let ok = !job.is_empty()
        && job.len() <= MAX_JOB
        && job.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && job
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid job name {:?}: a job name is 1 to {MAX_JOB} lowercase letters, digits, \
             '-', '_' or '.', starting with a letter or digit",
            clean(job)
        ))
    }
}

/// The token from `LEASEGATE_TIMER_TOKEN` (as it is, or pasted with its `Bearer ` scheme).
/// Errors name the variable, never its value.
fn bearer(value: Option<String>) -> Result<String, String> {
    let value = value.ok_or_else(|| {
        format!("status needs {TIMER_TOKEN}: the app's timer_token (its admin_token works too)")
    })?;
    let token = value.trim();
    let token = token
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
        .map_or(token, |_| token[7..].trim_start());
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{TIMER_TOKEN} is not a bearer token (visible ASCII characters, no spaces)"
        ));
    }
    Ok(token.to_string())
}

/// Where the app is: a checked base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `http` or `https`.
    scheme: &'static str,
    /// Host and port, no user info.
    authority: String,
    /// The base URL's path, without a trailing `/` (often empty).
    path: String,
    /// The host is this machine's (127.0.0.0/8, `::1`, `localhost`).
    loopback: bool,
}

impl Target {
    /// Checks `url` (named `source` in errors): an `http(s)` base URL without user info, query
    /// or fragment, that a token may be sent to (https, or http to this machine).
    pub fn parse(url: &str, source: &str) -> Result<Target, String> {
        let url = url.trim();
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "https" => "https",
            "http" => "http",
            _ => {
                return Err(format!(
                    "{source} must be an http:// or https:// URL, e.g. http://127.0.0.1:3000"
                ))
            }
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        // Neither is echoed: user info may hold a password, a query a key.
        if authority.contains('@') {
            return Err(format!(
                "{source} must not hold a user or password (user@host): the token is the \
                 credential"
            ));
        }
        if path.contains(['?', '#']) {
            return Err(format!(
                "{source} is the app's base URL: no query or fragment (/api/jobs/JOB is \
                 appended to it)"
            ));
        }
        let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| format!("{source}: an IPv6 host needs its closing ]"))?;
            let port =
                match after {
                    "" => None,
                    _ => Some(after.strip_prefix(':').ok_or_else(|| {
                        format!("{source}: after an IPv6 host's ] comes only :port")
                    })?),
                };
            (host, port)
        } else {
            match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{source} names no host"));
        }
        if let Some(port) = port {
            if port.parse::<u16>().is_err() {
                return Err(format!(
                    "{source}: the port must be a number from 0 to 65535"
                ));
            }
        }
        let loopback = if authority.starts_with('[') {
            host.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
        } else {
            host.eq_ignore_ascii_case("localhost")
                || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
        };
        if scheme == "http" && !loopback {
            return Err(format!(
                "{source}: the token is sent only over https, or over http to this machine \
                 (127.0.0.0/8, ::1, localhost); use the app's https:// URL"
            ));
        }
        let target = Target {
            scheme,
            authority: authority.to_ascii_lowercase(),
            path: path.trim_end_matches('/').to_string(),
            loopback,
        };
        if target.url("job").parse::<http::Uri>().is_err() {
            return Err(format!("{source} is not a valid URL"));
        }
        Ok(target)
    }

    /// `scheme://host[:port]`: what errors name (no user info, path or query).
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }

    /// The URL of `GET /api/jobs/{job}` (`job` checked by [`check_job`]: nothing to escape).
    pub fn url(&self, job: &str) -> String {
        format!("{}{}/api/jobs/{job}", self.origin(), self.path)
    }
}

/// The app's answer, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its status.
    pub status: u16,
    /// Its `Location`, if any (a redirect, not followed).
    pub location: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
}

/// `GET /api/jobs/{job}` with the token: one blocking exchange within [`TIMEOUT`], no
/// redirect followed.
fn get(target: &Target, job: &str, token: &str) -> Result<Answer, String> {
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .user_agent(concat!("leasegate-cli/", env!("CARGO_PKG_VERSION")));
    if target.loopback {
        // This machine is reached directly, never through a proxy (which would see the token
        // in clear over http).
        config = config.proxy(None);
    }
    let agent: ureq::Agent = config.build().into();
    let unreachable = |e: ureq::Error| {
        let origin = target.origin();
        match e {
            ureq::Error::Timeout(_) => format!(
                "the app at {origin} did not answer within {} s",
                TIMEOUT.as_secs()
            ),
            ureq::Error::HostNotFound => {
                format!("could not reach the app at {origin}: host not found")
            }
            ureq::Error::ConnectionFailed => {
                format!("could not reach the app at {origin}: the connection failed")
            }
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                format!("could not reach the app at {origin}: connection refused (is it running?)")
            }
            // The token rides in a header, never in the URL: ureq's text cannot hold it.
            e => format!(
                "could not reach the app at {origin}: {}",
                clean(&e.to_string())
            ),
        }
    };
    let response = agent
        .get(target.url(job))
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "application/json")
        .call()
        .map_err(unreachable)?;
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get("location")
        .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
    let body = response.into_body().read_to_vec().map_err(unreachable)?;
    Ok(Answer {
        status,
        location,
        body,
    })
}

/// An answer's JSON for a 200 with a JSON body, else the error to report, with the app's
/// `error` and `message`.
pub fn interpret(target: &Target, answer: &Answer) -> Result<Value, String> {
    let parsed: Option<Value> = serde_json::from_slice(&answer.body).ok();
    if answer.status == 200 {
        return parsed.ok_or_else(|| {
            format!(
                "the app at {} answered 200 but not with JSON: is it the scheduled-job app?",
                target.origin()
            )
        });
    }
    let reason = http::StatusCode::from_u16(answer.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .map_or(String::new(), |r| format!(" {r}"));
    let mut said = format!("the app answered {}{reason}", answer.status);
    let field = |name: &str| parsed.as_ref().and_then(|v| text(&v[name]));
    match (field("error"), field("message")) {
        (Some(code), Some(message)) => write!(said, ": {code}: {message}"),
        (Some(one), None) | (None, Some(one)) => write!(said, ": {one}"),
        (None, None) => write!(said, " (no JSON error in the answer)"),
    }
    .unwrap_or_default();
    match answer.status {
        401 | 403 => write!(
            said,
            "; {TIMER_TOKEN} must be the app's timer_token (or its admin_token)"
        ),
        300..=399 => write!(
            said,
            "; redirects are not followed (the token would go along){}",
            answer
                .location
                .as_deref()
                .map_or(String::new(), |l| format!(": it points to {}", clean(l)))
        ),
        _ => Ok(()),
    }
    .unwrap_or_default();
    Err(said)
}

#[cfg(test)]
mod tests {
    use super::terminal::tests::full;
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    const TOKEN: &str = "s3cret-timer-token";

    #[test]
    fn job_names() {
        for ok in ["example-job", "a", "0.nightly_x", &"j".repeat(63)] {
            check_job(ok).unwrap();
        }
        for bad in [
            "",
            "Job",
            "-x",
            ".x",
            "a/b",
            "a b",
            "../x",
            &"j".repeat(64),
            "é",
        ] {
            let e = check_job(bad).unwrap_err();
            assert!(e.starts_with("invalid job name"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_token_goes_only_over_https_or_to_this_machine() {
        let ok = |url: &str| Target::parse(url, "--app").unwrap();
        let t = ok("http://127.0.0.1:3000");
        assert!(t.loopback);
        assert_eq!(
            t.url("example-job"),
            "http://127.0.0.1:3000/api/jobs/example-job"
        );
        assert_eq!(
            ok("http://127.8.9.10:1/").url("j"),
            "http://127.8.9.10:1/api/jobs/j"
        );
        assert_eq!(
            ok("http://[::1]:3000").url("j"),
            "http://[::1]:3000/api/jobs/j"
        );
        assert_eq!(
            ok("HTTP://LocalHost").url("j"),
            "http://localhost/api/jobs/j"
        );
        assert_eq!(
            ok("https://jobs.example.com/base/").url("j"),
            "https://jobs.example.com/base/api/jobs/j"
        );
        assert!(!ok("https://jobs.example.com").loopback);
        assert_eq!(
            ok("https://10.0.0.5:8443").origin(),
            "https://10.0.0.5:8443"
        );

        let refused = |url: &str, want: &str| {
            let e = Target::parse(url, "LEASEGATE_APP_URL").unwrap_err();
            assert!(e.contains(want), "{url}: {e}");
            assert!(e.starts_with("LEASEGATE_APP_URL"), "{url}: {e}");
            assert!(!e.contains("pa55"), "{url}: {e}");
        };
        let clear = "the token is sent only over https, or over http to this machine";
        for url in [
            "http://example.invalid",
            "http://10.0.0.5:3000",
            "http://128.0.0.1",
            "http://[::2]:3000",
            "http://[::ffff:10.0.0.1]",
            "http://localhost.example.com",
            "http://127.0.0.1.example.com",
            "http://127.1",
        ] {
            refused(url, clear);
        }
        refused("http://localhost:1@example.com", "must not hold a user");
        refused("https://user:pa55@example.com", "must not hold a user");
        refused("https://example.com/?key=pa55", "no query or fragment");
        refused("https://example.com#pa55", "no query or fragment");
        refused("ftp://example.com", "must be an http:// or https:// URL");
        refused("127.0.0.1:3000", "must be an http:// or https:// URL");
        refused("http://", "names no host");
        refused("http://127.0.0.1:99999", "the port must be a number");
        refused("http://[::1", "closing ]");
        refused("http://[::1]evil", "only :port");
        refused("https://exa mple.com", "is not a valid URL");
    }

    fn vars<'a>(
        pairs: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&str) -> Result<Option<String>, String> + 'a {
        move |name| {
            Ok(pairs
                .iter()
                .find(|(n, v)| *n == name && !v.is_empty())
                .map(|(_, v)| v.to_string()))
        }
    }

    #[test]
    fn what_is_missing_or_refused_is_said_before_any_request() {
        // Unroutable if it were tried: the refusal comes first, at once.
        let e = run(
            "example-job",
            Some("http://10.255.255.1:9"),
            false,
            vars(&[(TIMER_TOKEN, TOKEN)]),
        )
        .unwrap_err();
        assert!(e.contains("only over https"), "{e}");
        assert!(!e.contains(TOKEN), "{e}");
        let e = run("example-job", None, false, vars(&[(TIMER_TOKEN, TOKEN)])).unwrap_err();
        assert!(e.contains("--app URL or LEASEGATE_APP_URL"), "{e}");
        let e = run(
            "example-job",
            None,
            false,
            vars(&[(APP_URL, "http://example.invalid")]),
        )
        .unwrap_err();
        assert!(
            e.starts_with("LEASEGATE_APP_URL: the token is sent only"),
            "{e}"
        );
        let e = run("example-job", Some("http://127.0.0.1:9"), false, vars(&[])).unwrap_err();
        assert!(e.contains("status needs LEASEGATE_TIMER_TOKEN"), "{e}");
        let e = run(
            "example-job",
            Some("http://127.0.0.1:9"),
            false,
            vars(&[(TIMER_TOKEN, "two words s3cret")]),
        )
        .unwrap_err();
        assert!(
            e.contains("is not a bearer token") && !e.contains("s3cret"),
            "{e}"
        );
        let e = run("Bad/Job", Some("http://127.0.0.1:9"), false, vars(&[])).unwrap_err();
        assert!(e.starts_with("invalid job name \"Bad/Job\""), "{e}");
    }

    #[test]
    fn the_token_as_pasted() {
        assert_eq!(bearer(Some(format!(" {TOKEN}\n"))).unwrap(), TOKEN);
        assert_eq!(bearer(Some(format!("Bearer {TOKEN}"))).unwrap(), TOKEN);
        assert_eq!(bearer(Some(format!("bearer  {TOKEN}"))).unwrap(), TOKEN);
        assert!(bearer(Some(" \t".into())).is_err());
        assert!(bearer(Some("Bearer a\u{1b}b".into())).is_err());
        assert!(bearer(None).is_err());
    }

    /// Serves `answers` one connection each on 127.0.0.1 and sends back each request's head.
    fn serve(answers: Vec<String>) -> (u16, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (seen, heads) = mpsc::channel();
        std::thread::spawn(move || {
            for answer in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let _ = seen.send(head);
                let _ = reader.get_mut().write_all(answer.as_bytes());
            }
        });
        (port, heads)
    }

    fn http(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n{body}",
            body.len()
        )
    }

    #[test]
    fn against_a_local_app() {
        let ok = full().to_string();
        let (port, heads) = serve(vec![
            http("200 OK", "content-type: application/json\r\n", &ok),
            http("200 OK", "content-type: application/json\r\n", &ok),
            http(
                "401 Unauthorized",
                "content-type: application/json\r\n",
                r#"{"error":"unauthorized","message":"send Authorization: Bearer <token>"}"#,
            ),
            http(
                "404 Not Found",
                "content-type: application/json\r\n",
                r#"{"error":"unknown_job","message":"this component runs job example-job"}"#,
            ),
            http("302 Found", "location: https://elsewhere.example/x\r\n", ""),
            http(
                "200 OK",
                "content-type: text/html\r\n",
                "<html>hello</html>",
            ),
            http("502 Bad Gateway", "", "upstream down"),
        ]);
        let app = format!("http://127.0.0.1:{port}");
        let token = [(TIMER_TOKEN, TOKEN)];
        let status = |json: bool| run("example-job", Some(&app), json, vars(&token));

        let text = status(false).unwrap();
        assert_eq!(text, format_status(&full()));
        let head = heads.recv().unwrap();
        assert!(
            head.starts_with("GET /api/jobs/example-job HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("authorization: bearer {TOKEN}\r\n")),
            "{head}"
        );

        let text = status(true).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, full());
        assert!(
            text.starts_with("{\n  \"job\": \"example-job\",\n"),
            "{text}"
        );

        let errors: Vec<String> = (0..5).map(|_| status(false).unwrap_err()).collect();
        for e in &errors {
            assert!(!e.contains(TOKEN), "{e}");
        }
        assert_eq!(
            errors[0],
            "the app answered 401 Unauthorized: unauthorized: send Authorization: Bearer \
             <token>; LEASEGATE_TIMER_TOKEN must be the app's timer_token (or its admin_token)"
        );
        assert_eq!(
            errors[1],
            "the app answered 404 Not Found: unknown_job: this component runs job example-job"
        );
        assert!(
            errors[2].starts_with("the app answered 302 Found (no JSON error in the answer)")
                && errors[2].ends_with("it points to https://elsewhere.example/x"),
            "{}",
            errors[2]
        );
        assert!(
            errors[3].contains("answered 200 but not with JSON"),
            "{}",
            errors[3]
        );
        assert_eq!(
            errors[4],
            "the app answered 502 Bad Gateway (no JSON error in the answer)"
        );
    }

    #[test]
    fn an_app_that_is_not_there() {
        // A port nobody listens on: bound, then closed.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = run(
            "example-job",
            Some(&format!("http://127.0.0.1:{port}")),
            false,
            vars(&[(TIMER_TOKEN, TOKEN)]),
        )
        .unwrap_err();
        assert!(
            e.starts_with(&format!(
                "could not reach the app at http://127.0.0.1:{port}"
            )),
            "{e}"
        );
        assert!(!e.contains(TOKEN), "{e}");
    }
}
