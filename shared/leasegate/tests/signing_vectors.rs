//! Signing test vectors: one folder per case under `tests/vectors/`, one file per stage.
//!
//! A SharedKey case holds `account.txt` (name, base64 key), `request.http` (request line,
//! headers, blank line, body), and the expected `string-to-sign.txt` and `authorization.txt`.
//! A SAS case holds `sas.txt` (the parameters) and the expected `string-to-sign.txt` and
//! `token.txt`. The expected strings were written from the spec and the signatures computed by
//! an independent HMAC, not by this crate.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use leasegate::signing::{sign, string_to_sign, SasPermissions, SasResource, ServiceSas};
use leasegate::{AccountKey, ContainerName};

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut cases: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("vectors folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 5,
        "expected at least 5 vector folders in {dir:?}"
    );
    cases
}

fn read(case: &Path, file: &str) -> String {
    fs::read_to_string(case.join(file)).unwrap_or_else(|e| panic!("{case:?}/{file}: {e}"))
}

fn account(case: &Path) -> (String, AccountKey) {
    let text = read(case, "account.txt");
    let mut lines = text.lines();
    let name = lines.next().expect("account name").to_string();
    let key = AccountKey::try_new(lines.next().expect("account key")).expect("valid key");
    (name, key)
}

fn parse_request(text: &str) -> leasegate::Request {
    let (head, body) = text
        .split_once("\n\n")
        .expect("a blank line after the headers");
    let mut lines = head.lines();
    let (method, url) = lines
        .next()
        .and_then(|l| l.split_once(' '))
        .expect("request line");
    let method = leasegate::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = leasegate::Request::new(method, url);
    for line in lines {
        let (name, value) = line.split_once(':').expect("header line");
        request = request.with_header(name.trim(), value.trim());
    }
    request.with_body(body.as_bytes().to_vec())
}

fn rfc3339(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).expect("RFC 3339 time")
}

#[test]
fn shared_key_vectors() {
    let mut checked = 0;
    for case in cases().iter().filter(|c| c.join("request.http").exists()) {
        let label = case.file_name().unwrap().to_string_lossy().to_string();
        let (name, key) = account(case);
        let mut request = parse_request(&read(case, "request.http"));
        if let Some(len) = request.headers().get("content-length") {
            let len: usize = len.parse().unwrap();
            assert_eq!(
                len,
                request.body().len(),
                "{label}: Content-Length matches the body"
            );
        }
        let expected = read(case, "string-to-sign.txt");
        assert_eq!(
            string_to_sign(&request, &name),
            expected,
            "{label}: string to sign"
        );
        sign(&mut request, &name, &key).unwrap();
        assert_eq!(
            request.headers().get("authorization").unwrap(),
            read(case, "authorization.txt").trim_end(),
            "{label}: Authorization"
        );
        checked += 1;
    }
    assert!(checked >= 4);
}

#[test]
fn service_sas_vectors() {
    let mut checked = 0;
    for case in cases().iter().filter(|c| c.join("sas.txt").exists()) {
        let label = case.file_name().unwrap().to_string_lossy().to_string();
        let (name, key) = account(case);
        let params = read(case, "sas.txt");
        let field = |k: &str| {
            params
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{k}: ")))
                .unwrap_or_else(|| panic!("{label}: no {k} in sas.txt"))
                .to_string()
        };
        let resource = field("resource");
        let container = resource
            .strip_prefix("container ")
            .expect("container resource");
        let sp = field("permissions");
        let sas = ServiceSas {
            resource: SasResource::Container(ContainerName::try_new(container).unwrap()),
            permissions: SasPermissions {
                read: sp.contains('r'),
                add: sp.contains('a'),
                create: sp.contains('c'),
                write: sp.contains('w'),
                delete: sp.contains('d'),
                list: sp.contains('l'),
            },
            start: Some(rfc3339(&field("start"))),
            expiry: rfc3339(&field("expiry")),
            protocol: Some(field("protocol")),
        };
        assert_eq!(
            sas.string_to_sign(&name),
            read(case, "string-to-sign.txt"),
            "{label}: string to sign"
        );
        assert_eq!(
            sas.token(&name, &key).unwrap().query(),
            read(case, "token.txt").trim_end(),
            "{label}: token"
        );
        checked += 1;
    }
    assert!(checked >= 1);
}
