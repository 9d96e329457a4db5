//! Bearer-token authentication of the HTTP functions, checked before any other configuration
//! is read, so an unauthenticated caller learns nothing of the setup.

use leasegate::{Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{self, ConfigError, Variables};
use crate::web;

/// How callers of one function are authenticated.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Bearer <token>` (the scheme in any case).
    Bearer(String),
    /// No authentication, set on purpose (`{fn}_auth = "none"`).
    None,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Auth::None => f.write_str("None"),
        }
    }
}

impl Auth {
    /// Reads `{token_var}` and `{mode_var}` (`bearer`, the default, or `none`). An empty token
    /// is refused unless the mode is `none`: the function refuses to serve rather than serve
    /// everyone.
    pub fn load(
        vars: &dyn Variables,
        token_var: &str,
        mode_var: &str,
    ) -> Result<Auth, ConfigError> {
        match config::var(vars, mode_var).as_deref() {
            Some("none") => Ok(Auth::None),
            None | Some("bearer") => match config::var(vars, token_var) {
                Some(token) => Ok(Auth::Bearer(token)),
                None => Err(ConfigError(format!(
                    "{token_var} is empty: this function refuses to serve without it; set \
                     {token_var}, or set {mode_var}=none to serve without authentication"
                ))),
            },
            Some(_) => Err(ConfigError(format!(
                "variable {mode_var} must be bearer or none"
            ))),
        }
    }

    /// Checks the request's `Authorization` header. `Err` is the 401 to send.
    pub fn check(&self, request: &Request) -> Result<(), Response> {
        let Auth::Bearer(token) = self else {
            return Ok(());
        };
        let presented = request
            .headers()
            .get("authorization")
            .and_then(bearer_token)
            .unwrap_or("");
        // Compared as digests, in constant time: neither the token nor its length leaks.
        let (want, got) = (Sha256::digest(token.as_bytes()), Sha256::digest(presented));
        if !presented.is_empty() && bool::from(want.ct_eq(&got)) {
            return Ok(());
        }
        let mut r = web::error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send Authorization: Bearer <token>",
        );
        r.headers_mut().insert("www-authenticate", "Bearer");
        Err(r)
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(char::is_whitespace)?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Loads `{token_var}`/`{mode_var}` and checks the request: the first thing a handler does.
/// `Err` is the answer: 503 `not_configured` (saying only that the token is missing) or 401.
pub fn authenticate(
    vars: &dyn Variables,
    token_var: &str,
    mode_var: &str,
    request: &Request,
) -> Result<(), Response> {
    let auth = Auth::load(vars, token_var, mode_var)
        .map_err(|e| web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e))?;
    auth.check(request)
}

/// What a caller of the timer functions' HTTP routes may do, by the token it presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// The tick token (`timer_token`): what a scheduler needs (ticks, read-only status).
    Tick,
    /// The admin token (`admin_token`): everything, the destructive routes included (marking
    /// blobs, resetting an initialization, a leader's step-down, manual runs of past
    /// occurrences).
    Admin,
}

/// The variable holding the timer functions' admin token.
pub const ADMIN_TOKEN_VAR: &str = "admin_token";

/// The admin token, if set and not the tick token (one secret for both would give every
/// scheduler the destructive powers).
fn admin_token(vars: &dyn Variables) -> Option<String> {
    config::var(vars, ADMIN_TOKEN_VAR)
        .filter(|a| config::var(vars, "timer_token").as_ref() != Some(a))
}

/// Authenticates a caller of a timer function's routes: the admin token (`admin_token`, when
/// set) or the tick token (`timer_token`, with `timer_auth`). `Err` is the answer: 503
/// `not_configured` (the tick token is missing) or 401, before any other setting is read.
pub fn authenticate_timer(vars: &dyn Variables, request: &Request) -> Result<Power, Response> {
    if let Some(admin) = admin_token(vars) {
        if Auth::Bearer(admin).check(request).is_ok() {
            return Ok(Power::Admin);
        }
    }
    authenticate(vars, "timer_token", "timer_auth", request).map(|()| Power::Tick)
}

/// Lets an authenticated caller use a destructive route (`what` names it) only with the admin
/// token. `Err` is the answer: 503 `not_configured` naming `admin_token` when it is empty (the
/// route refuses to serve), else 403 `forbidden`.
pub fn require_admin(vars: &dyn Variables, power: Power, what: &str) -> Result<(), Response> {
    if power == Power::Admin {
        return Ok(());
    }
    if admin_token(vars).is_none() {
        return Err(web::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            format!(
                "{ADMIN_TOKEN_VAR} is empty (or the same as timer_token): {what} refuses to \
                 serve without it; set {ADMIN_TOKEN_VAR} to a secret of its own"
            ),
        ));
    }
    Err(web::error(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "{what} needs the admin token ({ADMIN_TOKEN_VAR}); the tick token (timer_token) \
             only ticks and reads"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &str) -> Request {
        Request::new(leasegate::Method::GET, "/").with_header("authorization", v)
    }

    #[test]
    fn bearer_tokens_are_checked_and_never_printed() {
        let auth = Auth::Bearer("s3cret".into());
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER  s3cret ",
            "BeArEr\ts3cret",
        ] {
            assert!(auth.check(&with(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Basic s3cret",
            "s3cret",
            "Bearer",
            "Bearer ",
        ] {
            let r = auth.check(&with(bad)).unwrap_err();
            assert_eq!(r.status(), 401, "{bad}");
            assert!(!String::from_utf8_lossy(r.body()).contains("s3cret"));
        }
        let bare = Request::new(leasegate::Method::GET, "/");
        assert!(auth.check(&bare).is_err());
        assert!(Auth::None.check(&bare).is_ok());
        assert!(!format!("{auth:?}").contains("s3cret"));
    }

    #[test]
    fn an_empty_token_refuses_to_serve_unless_switched_off() {
        let vars = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let err = Auth::load(&vars(&[]), "t_token", "t_auth").unwrap_err();
        assert!(err.0.contains("t_token is empty"), "{}", err.0);
        assert_eq!(
            Auth::load(&vars(&[("t_auth", "none")]), "t_token", "t_auth").unwrap(),
            Auth::None
        );
        assert!(Auth::load(&vars(&[("t_auth", "maybe")]), "t_token", "t_auth").is_err());
    }

    #[test]
    fn the_admin_token_is_apart_from_the_tick_token() {
        let vars = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let both = vars(&[("timer_token", "tick"), ("admin_token", "adm")]);
        assert_eq!(
            authenticate_timer(&both, &with("Bearer adm")).unwrap(),
            Power::Admin
        );
        assert_eq!(
            authenticate_timer(&both, &with("Bearer tick")).unwrap(),
            Power::Tick
        );
        assert_eq!(
            authenticate_timer(&both, &with("Bearer x"))
                .unwrap_err()
                .status(),
            401
        );
        assert!(require_admin(&both, Power::Admin, "it").is_ok());
        let r = require_admin(&both, Power::Tick, "it").unwrap_err();
        assert_eq!(r.status(), 403);
        assert!(!String::from_utf8_lossy(r.body()).contains("adm\""));
        // No admin token, or the tick token again: the destructive routes refuse to serve.
        for v in [
            vars(&[("timer_token", "tick")]),
            vars(&[("timer_token", "tick"), ("admin_token", "tick")]),
        ] {
            assert_eq!(
                authenticate_timer(&v, &with("Bearer tick")).unwrap(),
                Power::Tick
            );
            let r = require_admin(&v, Power::Tick, "it").unwrap_err();
            assert_eq!(r.status(), 503);
            assert!(String::from_utf8_lossy(r.body()).contains("admin_token"));
        }
        // timer_auth = none opens the tick routes only.
        let open = vars(&[("timer_auth", "none")]);
        let bare = Request::new(leasegate::Method::GET, "/");
        assert_eq!(authenticate_timer(&open, &bare).unwrap(), Power::Tick);
        assert_eq!(
            require_admin(&open, Power::Tick, "it")
                .unwrap_err()
                .status(),
            503
        );
    }
}
