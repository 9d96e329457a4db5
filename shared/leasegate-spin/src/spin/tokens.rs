//! The bearer tokens of an instance's storage requests: the one it holds, the key-value
//! store's, or a new one from the token source, one request for them at a time.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use leasegate::token::{Token, TokenSource};
use leasegate::AccessToken;

use super::{SpinCache, SpinTransport, SpinVariables};
use crate::cache::{Cache, NoCache};

pub(super) async fn access_token(
    transport: &SpinTransport,
    source: &TokenSource,
    refresh: bool,
) -> Result<AccessToken, leasegate::Error> {
    let key = crate::cache::token_key(source);
    let held = |now| {
        TOKENS.with(|t| match &*t.held.borrow() {
            Some((k, t)) if *k == key && crate::token::usable(t.expires_at, now) => {
                Some(t.value.clone())
            }
            _ => None,
        })
    };
    if !refresh {
        if let Some(token) = held(SystemTime::now()) {
            return Ok(token);
        }
    }
    // One token request at a time in this invocation: the storage requests a batch sends
    // at once wait for the first one's token instead of each asking for one.
    let asking = TOKENS.with(|t| Rc::clone(&t.asking));
    let _turn = asking.lock().await;
    let now = SystemTime::now();
    if !refresh {
        if let Some(token) = held(now) {
            return Ok(token);
        }
    }
    // The source was asked a moment ago (while this request waited, say): its failure is
    // this request's too, and a token it gave after a refusal serves this refusal too.
    // Asking again in turn would multiply the wait on a failing endpoint, or the tokens
    // a batch whose requests storage refused at once asks for.
    let recent = TOKENS.with(|t| {
        t.asked
            .borrow()
            .as_ref()
            .filter(|a| a.key == key && now < a.at + SHARED_FOR)
            .map(|a| (a.refresh, a.failed.clone()))
    });
    // With `refresh`, the held token is the one storage refused: not handed out again,
    // even if no new one can be had.
    let refused = |e| {
        if refresh {
            TOKENS.with(|t| *t.held.borrow_mut() = None);
        }
        e
    };
    match recent {
        Some((_, Some(failed))) => return Err(refused(leasegate::Error::Token(failed))),
        Some((true, None)) => {
            if let Some(token) = held(now) {
                return Ok(token);
            }
        }
        _ => {}
    }
    let store = SpinCache::default();
    let cache: &dyn Cache = match crate::config::token_cache(&SpinVariables) {
        Ok(false) => &NoCache,
        _ => &store,
    };
    let token = crate::token::cached(cache, source, now, refresh, async || {
        let fetched = leasegate::token::fetch(transport, source, now).await;
        let failed = match &fetched {
            Err(leasegate::Error::Token(e)) => Some(e.clone()),
            _ => None,
        };
        TOKENS.with(|t| {
            *t.asked.borrow_mut() = Some(Asked {
                key: key.clone(),
                at: SystemTime::now(),
                refresh,
                failed,
            });
        });
        let token = fetched?;
        crate::log_line(serde_json::json!({
            "event": "access_token_fetched",
            "source": source.describe(),
            "refresh": refresh,
            "expiresInSeconds": token.expires_at.duration_since(now).map(|d| d.as_secs()).unwrap_or(0),
        }));
        Ok(token)
    })
    .await
    .map_err(refused)?;
    TOKENS.with(|t| *t.held.borrow_mut() = Some((key, token.clone())));
    Ok(token.value)
}

/// How long the answer of a token request serves the other token requests of the instance
/// (the `Retry-After` of a `token_unavailable` answer).
const SHARED_FOR: Duration = Duration::from_secs(5);

/// The last token request of an instance.
struct Asked {
    /// The source's store key.
    key: String,
    /// When it was answered.
    at: SystemTime,
    /// Whether storage had refused the token before it.
    refresh: bool,
    /// Its failure, if it failed.
    failed: Option<leasegate::token::TokenError>,
}

/// What an instance keeps of its tokens (Spin gives each invocation its own instance).
#[derive(Default)]
struct Tokens {
    /// The token this instance handed out last, with its store key: the invocation's later
    /// storage requests need no store read.
    held: RefCell<Option<(String, Token)>>,
    /// The last token request of this instance.
    asked: RefCell<Option<Asked>>,
    /// Held while a token is looked up or fetched.
    asking: Rc<futures::lock::Mutex<()>>,
}

thread_local! {
    static TOKENS: Tokens = Tokens::default();
}
