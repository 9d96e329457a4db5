//! What the proxy records of a request: how it was authorized, its target with any SAS
//! signature redacted, its `x-ms-*` headers and conditions.

use std::time::SystemTime;

use super::message::Message;
use super::{Fault, Seen};

/// The record of `request` (`method target`), which arrived now and got `fault`.
pub(super) fn seen(request: &Message, method: &str, target: &str, fault: &Option<Fault>) -> Seen {
    Seen {
        auth: auth_kind(request, target),
        target: redact(target),
        ms_headers: request
            .headers
            .iter()
            .filter(|(k, _)| {
                let k = k.to_ascii_lowercase();
                k.starts_with("x-ms-") || k == "if-match" || k == "if-none-match"
            })
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect(),
        method: method.to_string(),
        at: SystemTime::now(),
        fault: fault.clone(),
    }
}

fn auth_kind(request: &Message, target: &str) -> &'static str {
    match request.header("authorization") {
        Some(v) if v.starts_with("SharedKey ") => "SharedKey",
        Some(v) if v.starts_with("Bearer ") => "Bearer",
        Some(_) => "other",
        None if target.contains("sig=") => "SAS",
        None => "none",
    }
}

fn redact(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else {
        return target.to_string();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|p| {
            if p.starts_with("sig=") {
                "sig=REDACTED".to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}
