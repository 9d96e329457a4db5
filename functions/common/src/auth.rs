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
}
