//! A small in-memory Table service: what the fence protocol depends on, and a little more.
//! Create Table; entity insert, update (replace) and merge with `If-Match` (an ETag or `*`),
//! upsert (the same without `If-Match`), delete with `If-Match`; the point read
//! (`GET /{table}(PartitionKey='..',RowKey='..')`) with the entity's ETag; and the
//! [entity group transaction](https://learn.microsoft.com/rest/api/storageservices/performing-entity-group-transactions)
//! (`POST /$batch`, the `multipart/mixed` body `leasegate::table::Batch` writes), applied all
//! or none. Entities are kept as the JSON they were written with (each property's value and its
//! `@odata.type`), so an Int64 reads back as the core wrote it.
//!
//! A refused change set is answered as Azure and Azurite answer it: `202 Accepted` holding one
//! embedded response, the first failed operation's (`412 UpdateConditionNotSatisfied`, `409
//! EntityAlreadyExists`, `404 ResourceNotFound`), its `Content-ID` that operation's (from 1)
//! and its message starting with the operation's index (from 0: `"1:The specified entity
//! already exists."`), which is how the core's `Batch::parse` names the operation.
//!
//! Not modeled: queries (`$filter`), signatures, the Atom format, continuation, size limits,
//! more than one change set per batch, and the server's `Timestamp` below the storage clock's
//! second (the model writes a counter there, so each write's ETag differs).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::wire::{WireRequest, WireResponse};

/// One stored entity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// Its properties as written: each name (annotations `name@odata.type` included) to its
    /// JSON text.
    pub properties: BTreeMap<String, String>,
    /// Its version (a counter of the store's): the ETag and `Timestamp` are made from it.
    pub version: u64,
    /// When it was last written (storage seconds).
    pub written: u64,
}

impl Row {
    /// Property `name` as an Int64 (a decimal string annotated `Edm.Int64`, or a JSON number).
    pub fn int64(&self, name: &str) -> Option<i64> {
        match serde_json::from_str::<Value>(self.properties.get(name)?).ok()? {
            Value::String(s) => s.parse().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }
}

/// An entity's address: table, PartitionKey, RowKey.
pub type Key = (String, String, String);

/// The tables of one account.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Tables {
    tables: BTreeSet<String>,
    rows: BTreeMap<Key, Row>,
    versions: u64,
}

/// A refused operation: status, code, message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    status: u16,
    code: &'static str,
    message: &'static str,
}

const NOT_FOUND: Refused = Refused {
    status: 404,
    code: "ResourceNotFound",
    message: "The specified resource does not exist.",
};
const CONDITION: Refused = Refused {
    status: 412,
    code: "UpdateConditionNotSatisfied",
    message: "The update condition specified in the request was not satisfied.",
};
const EXISTS: Refused = Refused {
    status: 409,
    code: "EntityAlreadyExists",
    message: "The specified entity already exists.",
};
const TABLE_MISSING: Refused = Refused {
    status: 404,
    code: "TableNotFound",
    message: "The table specified does not exist.",
};

fn bad(message: &'static str) -> Refused {
    Refused {
        status: 400,
        code: "InvalidInput",
        message,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        412 => "Precondition Failed",
        _ => "Error",
    }
}

/// An operation that went through: its status, the entity's new ETag, a body.
struct Done {
    status: u16,
    etag: Option<String>,
    body: Option<Value>,
}

/// What one entity request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EntityOp {
    Insert,
    Replace,
    Merge,
    Delete,
    Read,
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// ([Hinnant's `civil_from_days`](https://howardhinnant.github.io/date_algorithms.html#civil_from_days)).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `2026-11-19T14:00:00.0000007Z`: the storage clock's second, the version as its fraction.
fn timestamp(secs: u64, version: u64) -> String {
    let (y, mo, d) = civil((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:07}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        version % 10_000_000
    )
}

/// The ETag of a row, as Azure writes them: `W/"datetime'<Timestamp, ':' as %3A>'"`.
fn etag(row: &Row) -> String {
    format!(
        "W/\"datetime'{}'\"",
        timestamp(row.written, row.version).replace(':', "%3A")
    )
}

/// `'text'` with `''` for a quote, at the start of `s`: the text and what follows.
fn literal(s: &str) -> Option<(String, &str)> {
    let mut rest = s.strip_prefix('\'')?;
    let mut out = String::new();
    loop {
        let end = rest.find('\'')?;
        out.push_str(&rest[..end]);
        rest = &rest[end + 1..];
        match rest.strip_prefix('\'') {
            Some(after) => {
                out.push('\'');
                rest = after;
            }
            None => return Some((out, rest)),
        }
    }
}

/// The table and keys of a request's path `/{account}/{table}[(PartitionKey='..',RowKey='..')]`
/// (percent-decoded): `(table, None)` for `/{table}` or `/{table}()`.
fn address(path: &str) -> Option<(String, Option<(String, String)>)> {
    let path = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .ok()?;
    let (_account, resource) = path.trim_start_matches('/').split_once('/')?;
    let Some((table, keys)) = resource.split_once('(') else {
        return Some((resource.to_string(), None));
    };
    if keys == ")" {
        return Some((table.to_string(), None));
    }
    let (pk, rest) = literal(keys.strip_prefix("PartitionKey=")?)?;
    let (rk, rest) = literal(rest.strip_prefix(",RowKey=")?)?;
    (rest == ")").then(|| (table.to_string(), Some((pk, rk))))
}

impl Tables {
    /// Creates `table` (as a deployment's set-up would).
    pub fn create(&mut self, table: &str) {
        self.tables.insert(table.to_string());
    }

    /// The entity at `(table, partition, row)`.
    pub fn row(&self, table: &str, partition: &str, row: &str) -> Option<&Row> {
        self.rows
            .get(&(table.to_string(), partition.to_string(), row.to_string()))
    }

    /// Every entity of `table`'s `partition`, by RowKey.
    pub fn partition<'a>(
        &'a self,
        table: &'a str,
        partition: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Row)> + 'a {
        self.rows
            .iter()
            .filter(move |((t, p, _), _)| t == table && p == partition)
            .map(|((_, _, r), row)| (r.as_str(), row))
    }

    /// Answers a request to the Table service and applies what it does (undated: see
    /// [`crate::storage::Storage::handle_table`]).
    pub fn answer(&mut self, r: &WireRequest, clock: u64) -> WireResponse {
        let Some((resource, keys)) = address(r.path()) else {
            return error(&bad("The model cannot read this address."));
        };
        match (r.method.as_str(), resource.as_str(), keys) {
            ("POST", "$batch", None) => self.batch(r, clock),
            ("POST", "Tables", None) => self.create_table(r),
            (_, table, keys) => match self.entity(r, table, keys, clock) {
                Ok(done) => {
                    let mut answer = WireResponse::new(done.status);
                    if let Some(etag) = done.etag {
                        answer = answer.with("etag", etag);
                    }
                    if let Some(body) = done.body {
                        answer = answer.with("content-type", JSON);
                        answer.body = body.to_string().into_bytes();
                    }
                    answer
                }
                Err(refused) => error(&refused),
            },
        }
    }

    fn create_table(&mut self, r: &WireRequest) -> WireResponse {
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let Some(name) = body["TableName"].as_str() else {
            return error(&bad("A table name is needed."));
        };
        if !self.tables.insert(name.to_string()) {
            let exists = Refused {
                status: 409,
                code: "TableAlreadyExists",
                message: "The table specified already exists.",
            };
            return error(&exists);
        }
        WireResponse::new(204)
    }

    /// One entity request (alone, or embedded in a batch).
    fn entity(
        &mut self,
        r: &WireRequest,
        table: &str,
        keys: Option<(String, String)>,
        clock: u64,
    ) -> Result<Done, Refused> {
        let op = match (r.method.as_str(), &keys) {
            ("POST", None) => EntityOp::Insert,
            ("PUT", Some(_)) => EntityOp::Replace,
            ("PATCH" | "MERGE", Some(_)) => EntityOp::Merge,
            ("DELETE", Some(_)) => EntityOp::Delete,
            ("GET", Some(_)) => EntityOp::Read,
            _ => return Err(bad("The model does not take this request (queries, say).")),
        };
        if !self.tables.contains(table) {
            return Err(TABLE_MISSING);
        }
        let body: Map<String, Value> = match op {
            EntityOp::Delete | EntityOp::Read => Map::new(),
            _ => match serde_json::from_slice(&r.body) {
                Ok(Value::Object(map)) => map,
                _ => return Err(bad("The body is not a JSON object.")),
            },
        };
        let (pk, rk) = match keys {
            Some(keys) => keys,
            None => match (&body.get("PartitionKey"), &body.get("RowKey")) {
                (Some(Value::String(p)), Some(Value::String(r))) => (p.clone(), r.clone()),
                _ => return Err(bad("An entity needs a string PartitionKey and RowKey.")),
            },
        };
        let key = (table.to_string(), pk, rk);
        let existing = self.rows.get(&key);
        if op == EntityOp::Read {
            let row = existing.ok_or(NOT_FOUND)?;
            return Ok(Done {
                status: 200,
                etag: Some(etag(row)),
                body: Some(read_body(&key, row, r.query("$select").as_deref())),
            });
        }
        // `If-Match`: an update, merge or delete of an entity that is not there is refused
        // (404), one at another version too (412); without it a PUT or PATCH is an upsert.
        match (r.header("if-match"), existing) {
            (Some(_), None) => return Err(NOT_FOUND),
            (Some("*"), Some(_)) | (None, _) => {}
            (Some(want), Some(row)) if want == etag(row) => {}
            (Some(_), Some(_)) => return Err(CONDITION),
        }
        if op == EntityOp::Delete {
            if r.header("if-match").is_none() {
                return Err(bad("A delete needs If-Match."));
            }
            self.rows.remove(&key);
            return Ok(Done {
                status: 204,
                etag: None,
                body: None,
            });
        }
        if op == EntityOp::Insert && existing.is_some() {
            return Err(EXISTS);
        }
        let mut properties = match (&op, existing) {
            (EntityOp::Merge, Some(row)) => row.properties.clone(),
            _ => BTreeMap::new(),
        };
        for (name, value) in &body {
            if matches!(name.as_str(), "PartitionKey" | "RowKey" | "Timestamp")
                || name.starts_with("odata.")
                || name.contains('@')
            {
                continue;
            }
            let annotation = format!("{name}@odata.type");
            match body.get(&annotation) {
                Some(t) => properties.insert(annotation, t.to_string()),
                None => properties.remove(&annotation),
            };
            properties.insert(name.clone(), value.to_string());
        }
        self.versions += 1;
        let row = Row {
            properties,
            version: self.versions,
            written: clock,
        };
        let tag = etag(&row);
        let echo = op == EntityOp::Insert && r.header("prefer") != Some("return-no-content");
        let body = echo.then(|| read_body(&key, &row, None));
        self.rows.insert(key, row);
        Ok(Done {
            status: if echo { 201 } else { 204 },
            etag: Some(tag),
            body,
        })
    }

    /// An entity group transaction: every operation applied to a copy, the copy kept only if
    /// all went through.
    fn batch(&mut self, r: &WireRequest, clock: u64) -> WireResponse {
        let Some(ops) = embedded_requests(r) else {
            return error(&bad("The model cannot read this batch."));
        };
        let mut partitions = BTreeSet::new();
        let mut rows = BTreeSet::new();
        for op in &ops {
            match address(op.path()) {
                Some((table, Some((pk, rk)))) => {
                    partitions.insert((table.clone(), pk.clone()));
                    rows.insert((table, pk, rk));
                }
                Some((table, None)) => {
                    let body: Value = serde_json::from_slice(&op.body).unwrap_or_default();
                    let pk = body["PartitionKey"].as_str().unwrap_or("").to_string();
                    let rk = body["RowKey"].as_str().unwrap_or("").to_string();
                    partitions.insert((table.clone(), pk.clone()));
                    rows.insert((table, pk, rk));
                }
                None => return error(&bad("The model cannot read this address.")),
            }
            if op.method == "GET" {
                return error(&bad("A change set holds writes only."));
            }
        }
        if ops.is_empty() || ops.len() > 100 || partitions.len() != 1 || rows.len() != ops.len() {
            let refused = Refused {
                status: 400,
                code: "InvalidInput",
                message: "One partition, each entity once, 1 to 100 operations.",
            };
            return error(&refused);
        }
        let mut copy = self.clone();
        let mut items = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            let (table, keys) = address(op.path()).expect("read above");
            match copy.entity(op, &table, keys, clock) {
                Ok(done) => items.push(embedded_response(
                    index,
                    done.status,
                    done.etag.as_deref(),
                    None,
                )),
                Err(refused) => {
                    // Nothing applied; the answer is the failed operation's alone.
                    let failed = embedded_response(
                        index,
                        refused.status,
                        None,
                        Some(error_body(&refused, Some(index))),
                    );
                    return batch_answer(&[failed]);
                }
            }
        }
        *self = copy;
        batch_answer(&items)
    }
}

const JSON: &str = "application/json;odata=minimalmetadata;streaming=true;charset=utf-8";

/// A point read's body: keys, `Timestamp`, the properties, `odata.etag` (`$select`: the keys
/// and those named).
fn read_body(key: &Key, row: &Row, select: Option<&str>) -> Value {
    let mut map = Map::new();
    map.insert("odata.etag".into(), etag(row).into());
    map.insert("PartitionKey".into(), key.1.clone().into());
    map.insert("RowKey".into(), key.2.clone().into());
    map.insert(
        "Timestamp".into(),
        timestamp(row.written, row.version).into(),
    );
    let wanted: Option<Vec<&str>> = select.map(|s| s.split(',').map(str::trim).collect());
    for (name, text) in &row.properties {
        let base = name.split('@').next().unwrap_or(name);
        if wanted.as_ref().is_some_and(|w| !w.contains(&base)) {
            continue;
        }
        if let Ok(value) = serde_json::from_str(text) {
            map.insert(name.clone(), value);
        }
    }
    Value::Object(map)
}

/// `{"odata.error": {"code": ..., "message": {"lang": "en-US", "value": "[index:]message"}}}`.
fn error_body(refused: &Refused, index: Option<usize>) -> String {
    let message = match index {
        Some(i) => format!("{i}:{}\nRequestId:model", refused.message),
        None => format!("{}\nRequestId:model", refused.message),
    };
    serde_json::json!({
        "odata.error": {
            "code": refused.code,
            "message": {"lang": "en-US", "value": message},
        }
    })
    .to_string()
}

/// An error answer of a request on its own.
fn error(refused: &Refused) -> WireResponse {
    WireResponse {
        status: refused.status,
        headers: vec![("content-type".into(), JSON.into())],
        body: error_body(refused, None).into_bytes(),
    }
}

/// The requests of a batch's change set: each part's embedded `METHOD URL HTTP/1.1`, headers
/// (lowercase) and body. `None` if the body is not such a batch.
fn embedded_requests(r: &WireRequest) -> Option<Vec<WireRequest>> {
    let boundary = |content_type: &str| {
        content_type
            .split(';')
            .find_map(|p| p.trim().strip_prefix("boundary="))
            .map(|b| b.trim_matches('"').to_string())
    };
    let batch = boundary(r.header("content-type")?)?;
    let body = std::str::from_utf8(&r.body).ok()?;
    let first = body.strip_prefix(&format!("--{batch}\r\n"))?;
    let (head, inner) = first.split_once("\r\n\r\n")?;
    let changeset = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Type: "))
        .and_then(boundary)?;
    let delimiter = format!("--{changeset}");
    let mut out = Vec::new();
    for part in inner.split(&delimiter).skip(1) {
        if part.starts_with("--") {
            return Some(out);
        }
        let part = part.strip_prefix("\r\n")?.strip_suffix("\r\n")?;
        let (_part_head, request) = part.split_once("\r\n\r\n")?;
        let (head, body) = request.split_once("\r\n\r\n").unwrap_or((request, ""));
        let mut lines = head.split("\r\n");
        let mut line = lines.next()?.split(' ');
        let method = line.next()?.to_string();
        let uri = line.next()?.to_string();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        out.push(WireRequest {
            method,
            uri,
            headers,
            body: body.as_bytes().to_vec(),
        });
    }
    None
}

/// A batch's operations in a few words each (for traces): `PUT fence if-match=W/".."
/// fencingToken=7`, `POST 0001 fencingToken=7`.
pub fn batch_summary(r: &WireRequest) -> Vec<String> {
    let Some(ops) = embedded_requests(r) else {
        return vec!["unreadable".into()];
    };
    ops.iter()
        .map(|op| {
            let body: Value = serde_json::from_slice(&op.body).unwrap_or_default();
            let row = match address(op.path()) {
                Some((_, Some((_, rk)))) => rk,
                _ => body["RowKey"].as_str().unwrap_or("?").to_string(),
            };
            let mut line = format!("{} {row}", op.method);
            if let Some(m) = op.header("if-match") {
                line.push_str(&format!(" if-match={m}"));
            }
            if let Some(t) = body.get("fencingToken") {
                line.push_str(&format!(" fencingToken={}", t.as_str().unwrap_or("?")));
            }
            line
        })
        .collect()
}

/// The RowKeys a batch writes other than by delete (inserts, updates, merges, upserts), in
/// order.
pub fn inserted_rows(r: &WireRequest) -> Vec<String> {
    embedded_requests(r)
        .unwrap_or_default()
        .iter()
        .filter(|op| op.method != "DELETE")
        .filter_map(|op| match address(op.path())? {
            (_, Some((_, rk))) => Some(rk),
            (_, None) => {
                let body: Value = serde_json::from_slice(&op.body).ok()?;
                Some(body["RowKey"].as_str()?.to_string())
            }
        })
        .collect()
}

/// Whether a batch answer says it was committed: `202` and every embedded response a success.
pub fn committed(answer: &WireResponse) -> bool {
    let Ok(text) = std::str::from_utf8(&answer.body) else {
        return false;
    };
    let statuses: Vec<&str> = text
        .split("\r\n")
        .filter_map(|l| l.strip_prefix("HTTP/1.1 "))
        .collect();
    answer.status == 202 && !statuses.is_empty() && statuses.iter().all(|s| s.starts_with('2'))
}

/// Removes the `If-Match` of the batch's operation on RowKey `row` (a planted mistake's
/// rewrite: an update becomes an upsert).
pub fn strip_if_match(r: &mut WireRequest, row: &str) {
    let Ok(text) = std::str::from_utf8(&r.body) else {
        return;
    };
    let address = format!("RowKey='{row}')");
    let mut in_op = false;
    let mut lines = Vec::new();
    for line in text.split("\r\n") {
        if line.contains(&address) && line.ends_with(" HTTP/1.1") {
            in_op = true;
        } else if line.is_empty() {
            in_op = false;
        } else if in_op && line.to_ascii_lowercase().starts_with("if-match:") {
            continue;
        }
        lines.push(line);
    }
    r.body = lines.join("\r\n").into_bytes();
}

/// One embedded response of a batch answer.
fn embedded_response(
    index: usize,
    status: u16,
    etag: Option<&str>,
    body: Option<String>,
) -> String {
    let mut out = format!(
        "Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
         HTTP/1.1 {status} {}\r\nContent-ID: {}\r\nX-Content-Type-Options: nosniff\r\n\
         Cache-Control: no-cache\r\nDataServiceVersion: 3.0;\r\n",
        reason(status),
        index + 1
    );
    if let Some(etag) = etag {
        out.push_str(&format!("ETag: {etag}\r\n"));
    }
    match body {
        Some(body) => out.push_str(&format!("Content-Type: {JSON}\r\n\r\n{body}\r\n")),
        None => out.push_str("\r\n\r\n"),
    }
    out
}

/// A batch answer: `202` holding one change set response of these parts.
fn batch_answer(parts: &[String]) -> WireResponse {
    let (batch, changeset) = ("batchresponse_model", "changesetresponse_model");
    let mut body =
        format!("--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n");
    for part in parts {
        body.push_str(&format!("--{changeset}\r\n{part}"));
    }
    body.push_str(&format!("--{changeset}--\r\n--{batch}--\r\n"));
    WireResponse {
        status: 202,
        headers: vec![(
            "content-type".into(),
            format!("multipart/mixed; boundary={batch}"),
        )],
        body: body.into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_civil_dates() {
        assert_eq!(timestamp(0, 0), "1970-01-01T00:00:00.0000000Z");
        // The model checker's start (`leasegate_model::world::START`): 2026-11-19T14:00:00Z.
        assert_eq!(timestamp(1_795_096_800, 7), "2026-11-19T14:00:00.0000007Z");
        assert_eq!(timestamp(951_782_400, 1), "2000-02-29T00:00:00.0000001Z");
    }

    #[test]
    fn addresses_decode_their_keys() {
        assert_eq!(
            address("/devstoreaccount1/ledger(PartitionKey='book-1',RowKey='o''brien%20x')"),
            Some(("ledger".into(), Some(("book-1".into(), "o'brien x".into()))))
        );
        assert_eq!(
            address("/devstoreaccount1/ledger"),
            Some(("ledger".into(), None))
        );
        assert_eq!(
            address("/devstoreaccount1/$batch"),
            Some(("$batch".into(), None))
        );
        assert_eq!(address("/devstoreaccount1/ledger(PartitionKey='a')"), None);
    }
}
