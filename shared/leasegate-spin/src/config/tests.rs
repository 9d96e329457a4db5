//! The settings' unit tests.
use super::*;
use leasegate::token::TokenSource;
use std::collections::HashMap;

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn numbers_are_finite_and_in_range() {
    let read = |v: &str| number(&vars(&[("n", v)]), "n", 7.0, 1..=100);
    assert_eq!(read(""), Ok(7.0));
    assert_eq!(read("30.5"), Ok(30.5));
    assert_eq!(read(" 1e2 "), Ok(100.0));
    for bad in ["0.5", "101", "inf", "NaN", "-1", "1,5", "ten"] {
        let err = read(bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "configuration: variable n must be a number from 1 to 100"
        );
    }
}

#[test]
fn azurite_defaults_are_path_style() {
    let s = storage(&vars(&[
        ("storage_account", "devstoreaccount1"),
        ("storage_key", leasegate::DEV_ACCOUNT_KEY),
        ("storage_origin", "http://127.0.0.1:10000"),
    ]))
    .unwrap();
    assert_eq!(s.account.endpoint().origin(), "http://127.0.0.1:10000");
    assert!(s.account.endpoint().is_path_style());
    assert_eq!(s.container.as_str(), "leasegate");
}

#[test]
fn azure_origin_is_host_style_and_sas_works() {
    let s = storage(&vars(&[
        ("storage_account", "myacct"),
        ("storage_sas", "sv=2021-12-02&sig=abc"),
        ("storage_origin", "https://myacct.blob.core.windows.net/"),
        ("container", "locks"),
    ]))
    .unwrap();
    assert!(!s.account.endpoint().is_path_style());
    assert!(matches!(s.account.credential(), Credential::Sas(_)));
}

#[test]
fn a_sas_wins_over_the_default_key() {
    let s = storage(&vars(&[
        ("storage_account", "devstoreaccount1"),
        ("storage_key", leasegate::DEV_ACCOUNT_KEY),
        ("storage_sas", "sv=2021-12-02&sig=abc"),
        ("storage_origin", "http://127.0.0.1:10000"),
    ]))
    .unwrap();
    assert!(matches!(s.account.credential(), Credential::Sas(_)));
}

#[test]
fn a_connection_string_elsewhere_than_storage_origin_is_refused_clearly() {
    let err = storage(&vars(&[
        (
            "storage_connection_string",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5",
        ),
        ("storage_origin", "http://127.0.0.1:10000"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("storage_origin=https://acct.blob.core.windows.net"),
        "{err}"
    );
    assert!(!err.contains("a2V5"), "{err}");
    // storage_origin with a SAS pasted into it: the query is not repeated.
    let err = storage(&vars(&[
        (
            "storage_connection_string",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5",
        ),
        (
            "storage_origin",
            "https://other.example/?sv=1&sig=T0PSECRET",
        ),
    ]))
    .unwrap_err()
    .to_string();
    assert!(!err.contains("T0PSECRET"), "{err}");
    assert!(
        err.contains("storage_origin is https://other.example"),
        "{err}"
    );
    let ok = storage(&vars(&[
        (
            "storage_connection_string",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5",
        ),
        ("storage_origin", "https://acct.blob.core.windows.net/"),
    ]));
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn errors_name_variables_not_values() {
    let secret = "bm90LWEtcmVhbC1rZXk-but-secret!!";
    let cases = [
        vars(&[
            ("storage_account", "a1b"),
            ("storage_origin", "http://h"),
            ("storage_key", secret),
        ]),
        vars(&[
            (
                "storage_connection_string",
                &format!("AccountName=x;AccountKey={secret}"),
            ),
            ("storage_origin", "http://h"),
        ]),
        vars(&[("storage_account", "a1b"), ("storage_origin", "http://h")]),
        vars(&[
            ("storage_account", "a1b"),
            ("storage_origin", "http://h"),
            ("storage_key", "a2V5"),
            ("container", "Bad_Name"),
        ]),
        vars(&[
            ("storage_account", "a1b"),
            ("storage_origin", "http://h"),
            ("storage_key", "a2V5"),
            ("storage_timeout_ms", "-3"),
        ]),
        vars(&[
            ("storage_account", "a1b"),
            ("storage_origin", "http://h"),
            ("storage_key", "a2V5"),
            ("max_in_flight", "0"),
        ]),
    ];
    for v in cases {
        let err = storage(&v).unwrap_err().to_string();
        assert!(err.starts_with("configuration: "), "{err}");
        assert!(!err.contains(secret), "{err}");
    }
}

fn entra(extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut v = vars(&[
        ("storage_account", "acct"),
        ("storage_origin", "https://acct.blob.core.windows.net"),
        // Azurite's key is every manifest's default: storage_auth must win over it.
        ("storage_key", leasegate::DEV_ACCOUNT_KEY),
    ]);
    for (k, val) in extra {
        v.insert(k.to_string(), val.to_string());
    }
    v
}

#[test]
fn storage_auth_chooses_an_entra_token_source() {
    let s = storage(&entra(&[
        ("storage_auth", "managed_identity"),
        ("identity_endpoint", "http://localhost:41741/msi/token"),
        ("identity_header", "hdr-secret-1"),
        ("token_origin", "http://localhost:41741"),
    ]))
    .unwrap();
    match s.account.credential() {
        Credential::Bearer(TokenSource::ManagedIdentity(_)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.account.endpoint().origin(),
        "https://acct.blob.core.windows.net"
    );
    assert!(!format!("{s:?}").contains("hdr-secret-1"));

    let s = storage(&entra(&[
        ("storage_auth", "client_secret"),
        ("entra_tenant_id", "contoso.onmicrosoft.com"),
        ("entra_client_id", "0000-aaaa"),
        ("entra_client_secret", "client-secret-2"),
    ]))
    .unwrap();
    match s.account.credential() {
        Credential::Bearer(TokenSource::ClientSecret(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(!format!("{s:?}").contains("client-secret-2"));

    let s = storage(&entra(&[("storage_auth", "key")])).unwrap();
    assert!(matches!(s.account.credential(), Credential::SharedKey(_)));
}

/// A bearer token or a SAS rides on every storage request as it is: never over plain http
/// to another machine (review #1). A shared key signs each request and never travels, so
/// it may; loopback (Azurite) stays allowed for every credential.
#[test]
fn a_token_or_a_sas_goes_to_storage_only_over_https_or_to_this_machine() {
    let bearer: [&[(&str, &str)]; 2] = [
        &[
            ("storage_auth", "managed_identity"),
            ("identity_endpoint", "http://localhost:41741/msi/token"),
            ("identity_header", "hdr-secret-1"),
            ("token_origin", "http://localhost:41741"),
        ],
        &[
            ("storage_auth", "client_secret"),
            ("entra_tenant_id", "contoso.onmicrosoft.com"),
            ("entra_client_id", "0000-aaaa"),
            ("entra_client_secret", "client-secret-2"),
        ],
    ];
    for extra in bearer {
        for (origin, allowed) in [
            ("http://acct.blob.core.windows.net", false),
            ("HTTP://acct.blob.core.windows.net", false),
            ("http://10.1.2.3:10000", false),
            ("http://localhost:1@acct.blob.core.windows.net", false),
            ("https://acct.blob.core.windows.net", true),
            ("http://127.0.0.1:10000", true),
            ("http://localhost:10000", true),
            ("http://[::1]:10000", true),
            ("http://[::1]", true),
            ("http://[::1]evil.example:10000", false),
        ] {
            let mut v = entra(extra);
            v.insert("storage_origin".into(), origin.into());
            match storage(&v) {
                Ok(_) => assert!(allowed, "{origin} was accepted for {extra:?}"),
                Err(e) => {
                    assert!(!allowed, "{origin}: {e}");
                    let e = e.to_string();
                    assert!(e.contains("variable storage_origin: "), "{e}");
                    if !origin.contains('@') {
                        // (user info is refused as such, whatever the credential)
                        assert!(e.contains("a bearer token"), "{e}");
                        assert!(e.contains("only over https"), "{e}");
                    }
                    assert!(!e.contains("secret-1") && !e.contains("secret-2"), "{e}");
                }
            }
        }
    }
    let sas = "sv=2021-12-02&sig=c2FzLXNlY3JldA%3D%3D";
    let sas_elsewhere = [
        vars(&[
            ("storage_account", "acct"),
            ("storage_origin", "http://acct.blob.core.windows.net"),
            ("storage_sas", sas),
        ]),
        vars(&[
            ("storage_account", "acct"),
            ("storage_origin", "http://acct.blob.core.windows.net"),
            ("storage_auth", "sas"),
            ("storage_sas", sas),
        ]),
        vars(&[
            (
                "storage_connection_string",
                &format!(
                    "BlobEndpoint=http://acct.blob.core.windows.net;SharedAccessSignature={sas}"
                ),
            ),
            ("storage_origin", "http://acct.blob.core.windows.net"),
        ]),
    ];
    for v in sas_elsewhere {
        let e = storage(&v).unwrap_err().to_string();
        assert!(e.contains("variable storage_origin: a SAS"), "{e}");
        assert!(!e.contains("c2FzLXNlY3JldA"), "{e}");
    }
    for origin in [
        "https://acct.blob.core.windows.net",
        "http://127.0.0.1:10000",
    ] {
        let v = vars(&[
            ("storage_account", "acct"),
            ("storage_origin", origin),
            ("storage_sas", sas),
        ]);
        assert!(storage(&v).is_ok(), "{origin}");
    }
    // A shared key signs; it does not travel.
    let key = vars(&[
        ("storage_account", "acct"),
        ("storage_origin", "http://acct.blob.core.windows.net"),
        ("storage_key", leasegate::DEV_ACCOUNT_KEY),
    ]);
    assert!(storage(&key).is_ok());
}

#[test]
fn entra_settings_that_cannot_work_are_named() {
    let cases: [(&[(&str, &str)], &str); 11] = [
        (&[("storage_auth", "entra")], "storage_auth must be key, sas, managed_identity or client_secret"),
        (&[("storage_auth", "managed_identity")], "variable identity_endpoint is not set (storage_auth = managed_identity)"),
        (
            &[("storage_auth", "managed_identity"), ("identity_endpoint", "http://localhost:1/msi")],
            "variable identity_header is not set",
        ),
        (
            &[
                ("storage_auth", "managed_identity"),
                ("identity_endpoint", "http://localhost:1/msi"),
                ("identity_header", "s3cret-header"),
            ],
            "identity_endpoint is at http://localhost:1, but token_origin is https://login.microsoftonline.com: set token_origin=http://localhost:1",
        ),
        (&[("storage_auth", "client_secret")], "variable entra_tenant_id is not set (storage_auth = client_secret)"),
        (
            &[("storage_auth", "client_secret"), ("entra_tenant_id", "t"), ("entra_client_id", "c")],
            "variable entra_client_secret is not set",
        ),
        (
            &[
                ("storage_auth", "client_secret"),
                ("entra_tenant_id", "t/../x"),
                ("entra_client_id", "c"),
                ("entra_client_secret", "s3cret-header"),
            ],
            "the tenant is a GUID or a domain name",
        ),
        (
            &[
                ("storage_auth", "client_secret"),
                ("storage_connection_string", "UseDevelopmentStorage=true"),
            ],
            "leave storage_connection_string empty",
        ),
        (
            &[
                ("storage_auth", "client_secret"),
                ("entra_tenant_id", "t"),
                ("entra_client_id", "c"),
                ("entra_client_secret", "s3cret-header"),
                ("storage_token_cache", "maybe"),
            ],
            "variable storage_token_cache must be on or off",
        ),
        (
            &[
                ("storage_auth", "client_secret"),
                ("entra_tenant_id", "t"),
                ("entra_client_id", "c"),
                ("entra_client_secret", "s3cret-header"),
                ("token_origin", "http://login.example"),
            ],
            "token_origin: a client secret is sent only over https",
        ),
        (
            &[
                ("storage_auth", "managed_identity"),
                ("identity_endpoint", "http://10.0.0.4:2377/msi"),
                ("identity_header", "s3cret-header"),
                ("token_origin", "http://10.0.0.4:2377"),
            ],
            "identity_endpoint: the identity header is sent only over https",
        ),
    ];
    for (extra, want) in cases {
        let err = storage(&entra(extra)).unwrap_err().to_string();
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("s3cret-header"), "{err}");
    }
}
