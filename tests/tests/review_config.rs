//! Adversarial review: secrets in error messages (pure functions, no Azurite needed).

use leasegate::account::DEV_ACCOUNT_KEY;
use leasegate::Account;

/// FINDING (secret in an error message): `Account::from_connection_string` names an unknown
/// setting by the text before its first `=`, cut to 32 characters (`truncate_for_message`).
/// When an account key lost its `AccountKey=` (or its `=` became a space), that text *is* the
/// key: up to 32 of its characters (lowercased) go into the error, which `config::storage` puts into the
/// 503 `not_configured` body of both functions.
#[test]
fn review_a_mangled_connection_string_does_not_echo_the_key() {
    let key = DEV_ACCOUNT_KEY;
    for cs in [
        format!("DefaultEndpointsProtocol=https;AccountName=acct;{key}"),
        format!("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey {key}"),
    ] {
        let err = Account::from_connection_string(&cs)
            .unwrap_err()
            .to_string();
        // Lowercased by the parser, but still the key's characters (base64 loses only case).
        assert!(
            !err.contains(&key[..12].to_ascii_lowercase()),
            "the error message carries the account key's first characters: {err}"
        );
    }
}
