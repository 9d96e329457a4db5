//! Table service SharedKey test vectors: one folder per case under `tests/table-vectors/`, one
//! file per stage, as the Blob service's (`tests/vectors/`, see `signing_vectors.rs`).
//!
//! Each case holds `account.txt` (name, base64 key), `request.http` (request line, headers,
//! blank line, body), and the expected `string-to-sign.txt` and `authorization.txt`. The
//! expected strings were written from the spec ("Authorize with Shared Key", Table service:
//! `VERB\nContent-MD5\nContent-Type\nDate\nCanonicalizedResource`, the resource keeping only
//! `?comp=`) and the signatures computed by an independent HMAC (Python's `hmac`), not by
//! this crate. `tests/tests/core/table_ops.rs` sends two of them, as recorded, to Azurite's table
//! emulator.

use std::fs;
use std::path::{Path, PathBuf};

use leasegate::table::signing::{sign, string_to_sign};
use leasegate::table::{self, CreateTable, TableName};
use leasegate::{Account, AccountKey};

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/table-vectors");
    let mut cases: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("table vectors folder")
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

#[test]
fn table_shared_key_vectors() {
    let mut checked = 0;
    for case in cases() {
        let label = case.file_name().unwrap().to_string_lossy().to_string();
        let (name, key) = account(&case);
        let mut request = parse_request(&read(&case, "request.http"));
        if let Some(len) = request.headers().get("content-length") {
            let len: usize = len.parse().unwrap();
            assert_eq!(
                len,
                request.body().len(),
                "{label}: Content-Length matches the body"
            );
        }
        assert_eq!(
            string_to_sign(&request, &name),
            read(&case, "string-to-sign.txt"),
            "{label}: string to sign"
        );
        sign(&mut request, &name, &key).unwrap();
        assert_eq!(
            request.headers().get("authorization").unwrap(),
            read(&case, "authorization.txt").trim_end(),
            "{label}: Authorization"
        );
        checked += 1;
    }
    assert!(checked >= 5);
}

/// The crate's own Create Table request, built at the vector's time, is signed as the vector
/// is: the operation sends the headers the vector signs.
#[test]
fn create_table_is_built_as_its_vector() {
    let case =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/table-vectors/create-table-path-style");
    let vector = parse_request(&read(&case, "request.http"));
    let account = Account::from_connection_string("UseDevelopmentStorage=true").unwrap();
    let op = CreateTable {
        table: TableName::try_new("vectortable").unwrap(),
    };
    let now = httpdate::parse_http_date("Sat, 21 Nov 2026 14:00:00 GMT").unwrap();
    let built = table::build(&op, &account, now).unwrap();
    assert_eq!(built.uri(), vector.uri(), "URL");
    assert_eq!(built.body(), vector.body(), "body");
    for (name, value) in vector.headers().iter() {
        assert_eq!(built.headers().get(name), Some(value), "header {name}");
    }
    assert_eq!(
        built.headers().get("authorization").unwrap(),
        read(&case, "authorization.txt").trim_end(),
        "Authorization"
    );
}
