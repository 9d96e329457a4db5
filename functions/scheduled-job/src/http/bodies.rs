//! The request bodies of the job's routes, read and checked: a tick's, a backfill's, a
//! rerun's and a pause's; each refusal a message naming what is wrong.

use super::*;

/// The body of a backfill: `{"from": "RFC 3339", "to": "RFC 3339"}`, both required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BackfillBody {
    #[serde(default, deserialize_with = "tick_at")]
    from: Option<String>,
    #[serde(default, deserialize_with = "tick_at")]
    to: Option<String>,
    #[serde(default, rename = "beforeHistory")]
    before_history: Option<bool>,
}

/// A backfill's range (Unix seconds, inclusive): `from` at or before `to`, `to` not ahead of
/// this instance's clock, `from` within the retention (older reservations may be gone, so an
/// occurrence there could have run).
pub(super) fn backfill_range(
    request: &Request,
    settings: &Settings,
    now: SystemTime,
) -> Result<BackfillAsk, String> {
    const SHAPE: &str = r#"the body must be {"from": "<RFC 3339 time>", "to": "<RFC 3339 time>"} (and optionally "beforeHistory": true)"#;
    if request.body().len() > MAX_BODY_BYTES {
        return Err(format!("the body may be at most {MAX_BODY_BYTES} bytes"));
    }
    let value: Value = serde_json::from_slice(request.body()).map_err(|_| SHAPE.to_string())?;
    if !value.is_object() {
        return Err(SHAPE.into());
    }
    let body = BackfillBody::deserialize(&value).map_err(|_| SHAPE.to_string())?;
    let time = |name: &str, v: Option<String>| -> Result<u64, String> {
        let v = v.ok_or_else(|| format!("{name} is required: {SHAPE}"))?;
        timer::parse_time(&v)
            .map(crate::unix)
            .ok_or_else(|| format!("{name} must be an RFC 3339 time (2026-11-21T14:55:00Z)"))
    };
    let (from, to) = (time("from", body.from)?, time("to", body.to)?);
    if from > to {
        return Err("from must be at or before to".into());
    }
    let now = crate::unix(now);
    if to > now {
        return Err(format!(
            "to is ahead of now ({}): a backfill runs past occurrences only",
            rfc3339(at(now))
        ));
    }
    let oldest = now.saturating_sub(settings.retention.as_secs());
    if from < oldest {
        return Err(format!(
            "from is older than the retention (job_retention_seconds: {} s, so from {} on): an \
             older occurrence's reservation may be gone, and it may have run",
            settings.retention.as_secs(),
            rfc3339(at(oldest))
        ));
    }
    Ok(BackfillAsk {
        from,
        to,
        before_history: body.before_history.unwrap_or(false),
    })
}

/// What a backfill's answer says of a range it moved up to the job's history.
pub(super) fn clamped(settings: &Settings, asked: u64, history: Option<u64>) -> Value {
    let begun = history.filter(|h| *h != u64::MAX);
    json!({
        "requestedFrom": rfc3339(at(asked)),
        "historyFrom": begun.map(|h| rfc3339(at(h))),
        "reason": match begun {
            Some(_) => format!(
                "a job's history begins at its first tick: occurrences due before it are not \
                 backfilled unless the body says \"beforeHistory\": true (job {})",
                settings.job
            ),
            None => format!(
                "no tick has begun job {}'s history yet: nothing before it is backfilled unless \
                 the body says \"beforeHistory\": true",
                settings.job
            ),
        },
    })
}

/// The body of a rerun: `{"occurrence": "RFC 3339"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RerunBody {
    #[serde(default, deserialize_with = "tick_at")]
    occurrence: Option<String>,
}

/// The occurrence a rerun names (Unix seconds): one of the job's schedule, not ahead of this
/// instance's clock.
pub(super) fn rerun_occurrence(
    request: &Request,
    settings: &Settings,
    now: SystemTime,
) -> Result<u64, String> {
    const SHAPE: &str = r#"the body must be {"occurrence": "<RFC 3339 time>"}"#;
    if request.body().len() > MAX_BODY_BYTES {
        return Err(format!("the body may be at most {MAX_BODY_BYTES} bytes"));
    }
    let value: Value = serde_json::from_slice(request.body()).map_err(|_| SHAPE.to_string())?;
    if !value.is_object() {
        return Err(SHAPE.into());
    }
    let body = RerunBody::deserialize(&value).map_err(|_| SHAPE.to_string())?;
    let named = body
        .occurrence
        .ok_or_else(|| format!("occurrence is required: {SHAPE}"))?;
    let t = timer::parse_time(&named)
        .ok_or_else(|| "occurrence must be an RFC 3339 time (2026-11-21T14:55:00Z)".to_string())?;
    if t > now {
        return Err(format!(
            "occurrence {} is ahead of now ({}): a rerun is for an occurrence that was due",
            rfc3339(t),
            rfc3339(now)
        ));
    }
    if settings.schedule.latest_at_or_before(t) != Some(t) {
        let nearest = settings
            .schedule
            .latest_at_or_before(t)
            .map(|p| format!(" (the one before it is {})", rfc3339(p)))
            .unwrap_or_default();
        return Err(format!(
            "{} is not an occurrence of the job's schedule{nearest}",
            rfc3339(t)
        ));
    }
    Ok(crate::unix(t))
}

/// The longest pause note, in characters.
pub(crate) const MAX_NOTE_CHARS: usize = 500;

/// Whether a body is empty (or whitespace, or `{}`).
pub(super) fn empty_body(request: &Request) -> bool {
    let body = request.body();
    body.iter().all(u8::is_ascii_whitespace)
        || serde_json::from_slice::<Value>(body)
            .is_ok_and(|v| v.as_object().is_some_and(|o| o.is_empty()))
}

/// The body of a pause: `{"note": "..."}`, `note` optional (at most [`MAX_NOTE_CHARS`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseBody {
    #[serde(default)]
    note: Option<String>,
}

pub(super) fn pause_note(request: &Request) -> Result<Option<String>, String> {
    if request.body().iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if request.body().len() > MAX_BODY_BYTES {
        return Err(format!("the body may be at most {MAX_BODY_BYTES} bytes"));
    }
    let value: Value = serde_json::from_slice(request.body())
        .map_err(|_| r#"the body must be JSON: {"note": "why"}"#.to_string())?;
    if !value.is_object() {
        return Err(r#"the body must be a JSON object {"note": "why"}"#.into());
    }
    let body = PauseBody::deserialize(&value)
        .map_err(|_| r#"the body may have only "note", a string"#.to_string())?;
    let note = body
        .note
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty());
    if note
        .as_ref()
        .is_some_and(|n| n.chars().count() > MAX_NOTE_CHARS)
    {
        return Err(format!("note may be at most {MAX_NOTE_CHARS} characters"));
    }
    Ok(note)
}

/// The body of an HTTP tick: `{"at": "2026-11-21T14:55:00Z", "nameReserver": true}`, each
/// optional. Any other field is a caller's mistake (a misspelt `at` would tick now), so it is
/// refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TickBody {
    #[serde(default, deserialize_with = "tick_at")]
    at: Option<String>,
    #[serde(default, rename = "nameReserver", deserialize_with = "name_reserver")]
    name_reserver: Option<bool>,
}

/// `nameReserver`: `true`, `false` or `null`, refused in fixed words otherwise.
pub(super) fn name_reserver<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<bool>, D::Error> {
    Option::<bool>::deserialize(d)
        .map_err(|_| <D::Error as serde::de::Error>::custom("nameReserver must be true or false"))
}

/// What an HTTP tick's body asks for: the trigger time (none: now) and whether a tick that
/// finds the occurrence reserved names the reserver.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TickAsk {
    pub(crate) at: Option<SystemTime>,
    pub(crate) name_reserver: bool,
}

/// `at`: a string or `null`; any other type is refused in fixed words naming the field
/// (serde's own would say only `invalid type: integer 5, expected a string`).
pub(crate) fn tick_at<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
        .map_err(|_| <D::Error as serde::de::Error>::custom("at must be a string"))
}

/// The longest part of a refused body's error that an answer repeats (serde's messages quote
/// what they refuse, a field name as long as the body included).
pub(crate) const MAX_ERROR_CHARS: usize = 200;

/// The optional `{"at": "RFC 3339", "nameReserver": true}` of a tick body (neither when the
/// body is empty).
pub(crate) fn tick_ask(request: &Request) -> Result<TickAsk, String> {
    if request.body().iter().all(u8::is_ascii_whitespace) {
        return Ok(TickAsk::default());
    }
    if request.body().len() > MAX_BODY_BYTES {
        return Err(format!("the body may be at most {MAX_BODY_BYTES} bytes"));
    }
    let shown = |e: serde_json::Error| {
        let mut e = e.to_string();
        if let Some((cut, _)) = e.char_indices().nth(MAX_ERROR_CHARS) {
            e.truncate(cut);
            e.push_str("...");
        }
        e
    };
    let value: Value = serde_json::from_slice(request.body())
        .map_err(|e| format!("the body is not valid JSON: {}", shown(e)))?;
    // An object only: serde would also take a struct from an array (`["..."]`).
    if !value.is_object() {
        return Err(r#"the body must be a JSON object {"at": "<RFC 3339 time>"}"#.into());
    }
    let body = TickBody::deserialize(&value)
        .map_err(|e| format!("the body is not a tick: {}", shown(e)))?;
    let at = match body.at {
        None => None,
        Some(s) => Some(
            timer::parse_time(&s)
                .ok_or_else(|| "at must be an RFC 3339 time (2026-11-21T14:55:00Z)".to_string())?,
        ),
    };
    Ok(TickAsk {
        at,
        name_reserver: body.name_reserver.unwrap_or(false),
    })
}
