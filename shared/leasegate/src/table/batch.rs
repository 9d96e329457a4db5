//! The [entity group transaction](https://learn.microsoft.com/rest/api/storageservices/performing-entity-group-transactions):
//! up to 100 writes to one partition of one table, applied all or none, in one
//! `POST /$batch`.
//!
//! The request is a `multipart/mixed` body ([RFC 2046](https://www.rfc-editor.org/rfc/rfc2046#section-5.1))
//! holding one change set (itself `multipart/mixed`), each part an embedded HTTP request
//! (`application/http`) with a `Content-ID`; the answer mirrors it with one embedded response
//! per operation, or, when the change set failed, one response: the failed operation's,
//! its message starting with the operation's index (`"2:The update condition..."`).
//!
//! The multipart writer and reader are written here rather than taken from a crate: the
//! format is protocol canonicalization in the sense of the signing code (a handful of lines
//! the service parses strictly, for one shape of message), the multipart crates that exist
//! are built for form uploads over an async body stream (with IO runtimes beneath), and the
//! core takes no such dependency.

use sha2::{Digest, Sha256};

use super::entity::{check_key, Entity, EntityTag, TableName};
use super::ops::{
    endpoint, entity_request, error_of, odata_error, refusal, request, EntityRequest, IfMatch,
    TableOperation, TableRefusal, UpsertMode, Verb, ACCEPT,
};
use crate::account::Account;
use crate::message::{Headers, Method, Request, Response, StatusCode};
use crate::Error;

/// The most operations one batch holds.
pub const MAX_BATCH_OPERATIONS: usize = 100;

/// The largest batch body the service takes: 4 MiB.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// One write of a batch; every entity is in the batch's partition.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOperation {
    /// Insert Entity ([`TableRefusal::AlreadyExists`] if it exists).
    Insert(Entity),
    /// Insert or replace / insert or merge.
    Upsert(Entity, UpsertMode),
    /// Update Entity (replace), `If-Match`.
    Update(Entity, IfMatch),
    /// Merge Entity, `If-Match`.
    Merge(Entity, IfMatch),
    /// Delete Entity, `If-Match`.
    Delete {
        /// The RowKey (the PartitionKey is the batch's).
        row_key: String,
        /// The condition.
        if_match: IfMatch,
    },
}

impl BatchOperation {
    /// The RowKey it writes.
    pub fn row_key(&self) -> &str {
        self.keys().1
    }

    fn keys(&self) -> (&str, &str) {
        match self {
            BatchOperation::Insert(e)
            | BatchOperation::Upsert(e, _)
            | BatchOperation::Update(e, _)
            | BatchOperation::Merge(e, _) => (&e.partition_key, &e.row_key),
            // The partition is checked by the batch, which supplies it.
            BatchOperation::Delete { row_key, .. } => ("", row_key),
        }
    }
}

/// An entity group transaction: writes to one partition of one table, checked as they are
/// added (at most [`MAX_BATCH_OPERATIONS`], one PartitionKey, each RowKey once), so a batch
/// storage would refuse is refused before it is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    table: TableName,
    partition_key: String,
    operations: Vec<BatchOperation>,
}

impl Batch {
    /// An empty batch of writes to `partition_key` in `table`.
    pub fn new(table: TableName, partition_key: impl Into<String>) -> Result<Self, Error> {
        let partition_key = partition_key.into();
        check_key("PartitionKey", &partition_key)?;
        Ok(Batch {
            table,
            partition_key,
            operations: Vec::new(),
        })
    }

    /// Adds `operation`; refused (and not added) when the batch is full, the entity is in
    /// another partition, or the batch already writes that RowKey.
    pub fn push(&mut self, operation: BatchOperation) -> Result<(), Error> {
        // Refused here, not left to storage: Azure names operation 99 in its 400, Azurite
        // answers a 400 for the whole change set without an index.
        if self.operations.len() >= MAX_BATCH_OPERATIONS {
            return Err(Error::InvalidArgument(format!(
                "a batch holds at most {MAX_BATCH_OPERATIONS} operations"
            )));
        }
        let (partition, row) = operation.keys();
        if !matches!(operation, BatchOperation::Delete { .. }) && partition != self.partition_key {
            return Err(Error::InvalidArgument(
                "every entity of a batch has the batch's PartitionKey".into(),
            ));
        }
        check_key("RowKey", row)?;
        if self.operations.iter().any(|op| op.keys().1 == row) {
            return Err(Error::InvalidArgument(
                "a batch writes each RowKey once".into(),
            ));
        }
        self.operations.push(operation);
        Ok(())
    }

    /// The batch with `operation` added ([`Batch::push`]).
    pub fn with(mut self, operation: BatchOperation) -> Result<Self, Error> {
        self.push(operation)?;
        Ok(self)
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The partition.
    pub fn partition_key(&self) -> &str {
        &self.partition_key
    }

    /// The operations, in order (an answer's index counts in this order, from 0).
    pub fn operations(&self) -> &[BatchOperation] {
        &self.operations
    }

    /// The embedded request of each operation.
    fn entity_requests(&self, account: &Account) -> Result<Vec<EntityRequest>, Error> {
        let endpoint = endpoint(account)?;
        let pk = self.partition_key.as_str();
        self.operations
            .iter()
            .map(|op| {
                let (verb, entity, if_match) = match op {
                    BatchOperation::Insert(e) => (Verb::Insert, Some(e), None),
                    BatchOperation::Upsert(e, UpsertMode::Replace) => {
                        (Verb::Replace, Some(e), None)
                    }
                    BatchOperation::Upsert(e, UpsertMode::Merge) => (Verb::Merge, Some(e), None),
                    BatchOperation::Update(e, m) => (Verb::Replace, Some(e), Some(m)),
                    BatchOperation::Merge(e, m) => (Verb::Merge, Some(e), Some(m)),
                    BatchOperation::Delete { if_match, .. } => (Verb::Delete, None, Some(if_match)),
                };
                let keys = (pk, op.keys().1);
                entity_request(endpoint, &self.table, verb, keys, entity, if_match)
            })
            .collect()
    }
}

/// The answer of one operation of a committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// Its status (204 for every write).
    pub status: StatusCode,
    /// The entity's new ETag (none for a delete).
    pub etag: Option<EntityTag>,
}

/// The answer to a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Every operation was applied: one item per operation, in order.
    Committed(Vec<BatchItem>),
    /// A condition of one operation did not hold, so **nothing** of the batch was applied.
    /// `index` is that operation's (from 0, in [`Batch::operations`] order), when storage
    /// named it (it always has, for the conditions below).
    Refused {
        /// The operation refused.
        index: Option<usize>,
        /// Why: an insert of an entity that exists, an `If-Match` that no longer holds (a
        /// fence entity moved on), an update or delete of an entity that is not there.
        refusal: TableRefusal,
    },
}

/// The boundary strings of a batch body: derived from a digest of what they enclose, so the
/// body is the same for the same batch (test vectors, retries) and no part can hold its own
/// boundary (the core has no randomness source; RFC 2046 asks only that the boundary not
/// occur in the parts).
fn boundaries(parts: &[Vec<u8>]) -> (String, String) {
    let mut digest = Sha256::new();
    for part in parts {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    let hex: String = digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (
        format!("batch_{}", &hex[..32]),
        format!("changeset_{}", &hex[32..]),
    )
}

/// One embedded request: request line (absolute URL), headers, blank line, body.
fn embedded(request: &EntityRequest) -> Vec<u8> {
    let mut out = format!("{} {} HTTP/1.1\r\n", request.method, request.url);
    for (name, value) in &request.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !request.body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", request.body.len()));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&request.body);
    out
}

impl TableOperation for Batch {
    type Output = BatchOutcome;

    fn request(&self, account: &Account) -> Result<Request, Error> {
        if self.operations.is_empty() {
            return Err(Error::InvalidArgument(
                "a batch holds at least one operation".into(),
            ));
        }
        let parts: Vec<Vec<u8>> = self
            .entity_requests(account)?
            .iter()
            .map(embedded)
            .collect();
        let (batch, changeset) = boundaries(&parts);
        let mut body =
            format!("--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n")
                .into_bytes();
        for (index, part) in parts.iter().enumerate() {
            body.extend_from_slice(
                format!(
                    "--{changeset}\r\nContent-Type: application/http\r\n\
                     Content-Transfer-Encoding: binary\r\nContent-ID: {}\r\n\r\n",
                    index + 1
                )
                .as_bytes(),
            );
            body.extend_from_slice(part);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{changeset}--\r\n\r\n--{batch}--\r\n").as_bytes());
        if body.len() > MAX_BATCH_BYTES {
            return Err(Error::InvalidArgument(
                "a batch's body is at most 4 MiB".into(),
            ));
        }
        Ok(request(
            Method::POST,
            endpoint(account)?.url("/$batch"),
            vec![
                ("accept", ACCEPT.to_string()),
                ("content-type", format!("multipart/mixed; boundary={batch}")),
                ("dataserviceversion", "3.0".to_string()),
            ],
            body,
        ))
    }

    fn parse(&self, response: &Response) -> Result<BatchOutcome, Error> {
        let status = response.status();
        if status.as_u16() != 202 {
            return Err(if status.is_success() {
                Error::unexpected(status, "expected status 202")
            } else {
                Error::Storage(super::ops::table_error(response))
            });
        }
        let unexpected = |detail: String| Error::unexpected(status, detail);
        let answers = sub_responses(response).map_err(unexpected)?;
        let failed = answers.iter().position(|a| !a.status.is_success());
        let Some(failed) = failed else {
            if answers.len() != self.operations.len() {
                return Err(unexpected(format!(
                    "{} answers to a batch of {}",
                    answers.len(),
                    self.operations.len()
                )));
            }
            return Ok(BatchOutcome::Committed(
                answers
                    .into_iter()
                    .map(|a| BatchItem {
                        status: a.status,
                        etag: a.headers.get("etag").map(EntityTag::new),
                    })
                    .collect(),
            ));
        };
        let answer = &answers[failed];
        let error = error_of(answer.status, &answer.headers, &answer.body);
        let index = failed_index(answer).filter(|i| *i < self.operations.len());
        match refusal(&error) {
            Some(refusal) => Ok(BatchOutcome::Refused { index, refusal }),
            None => Err(Error::Batch { index, error }),
        }
    }
}

/// The operation a failed answer names: its message starts with the index (`"2:..."`, from
/// 0); else its `Content-ID` (from 1, as this crate numbers them).
///
/// Quirk: Azurite numbers the failed answer's `Content-ID` itself (from 1, in order) rather
/// than echoing the request's; with the ids this crate sends the two agree.
fn failed_index(answer: &SubResponse) -> Option<usize> {
    let from_message = odata_error(&answer.body).and_then(|(_, message)| {
        let (digits, _) = message.split_once(':')?;
        digits.trim().parse::<usize>().ok()
    });
    from_message.or_else(|| {
        answer
            .headers
            .get("content-id")
            .and_then(|id| id.trim().parse::<usize>().ok())
            .and_then(|id| id.checked_sub(1))
    })
}

/// One embedded response of a batch answer.
#[derive(Debug)]
struct SubResponse {
    status: StatusCode,
    headers: Headers,
    body: Vec<u8>,
}

/// The embedded responses of a batch answer, in order: those of its change set, or (an
/// answer to the batch as a whole) those standing in the batch's body itself.
fn sub_responses(response: &Response) -> Result<Vec<SubResponse>, String> {
    let text = std::str::from_utf8(response.body()).map_err(|_| "the body is not UTF-8")?;
    let boundary = response
        .headers()
        .get("content-type")
        .and_then(boundary_of)
        .ok_or("the answer is not multipart/mixed with a boundary")?;
    let mut answers = Vec::new();
    for part in split_parts(text, &boundary)? {
        let (headers, body) = split_head(part)?;
        match headers.get("content-type").and_then(boundary_of) {
            Some(changeset) => {
                for inner in split_parts(body, &changeset)? {
                    answers.push(embedded_response(split_head(inner)?.1)?);
                }
            }
            None => answers.push(embedded_response(body)?),
        }
    }
    Ok(answers)
}

/// The `boundary` parameter of a `multipart/mixed` content type (quoted or not).
fn boundary_of(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/mixed") {
        return None;
    }
    params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty())
    })
}

/// The parts of a multipart body: between `--{boundary}` delimiter lines, up to the closing
/// `--{boundary}--`. Lines may end in CRLF or LF alone; the line break before a delimiter
/// belongs to the delimiter.
fn split_parts<'a>(body: &'a str, boundary: &str) -> Result<Vec<&'a str>, String> {
    let delimiter = format!("--{boundary}");
    let start = if body.starts_with(&delimiter) {
        0
    } else {
        body.find(&format!("\n{delimiter}"))
            .map(|i| i + 1)
            .ok_or("no multipart delimiter")?
    };
    let mut rest = &body[start + delimiter.len()..];
    let mut parts = Vec::new();
    loop {
        if rest.starts_with("--") {
            return Ok(parts);
        }
        // The rest of the delimiter line (transport padding) is skipped.
        let line_end = rest.find('\n').ok_or("a truncated multipart body")?;
        rest = &rest[line_end + 1..];
        let next = rest
            .find(&format!("\n{delimiter}"))
            .ok_or("a multipart body without its closing delimiter")?;
        parts.push(rest[..next].strip_suffix('\r').unwrap_or(&rest[..next]));
        rest = &rest[next + 1 + delimiter.len()..];
    }
}

/// A head (header lines up to a blank line) and what follows it.
fn split_head(text: &str) -> Result<(Headers, &str), String> {
    let mut headers = Headers::new();
    let mut rest = text;
    loop {
        let (line, after) = match rest.find('\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let line = line.strip_suffix('\r').unwrap_or(line);
        rest = after;
        if line.is_empty() {
            return Ok((headers, rest));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| "a header line without ':'".to_string())?;
        headers.append(name.trim(), value.trim());
        if after.is_empty() {
            return Ok((headers, ""));
        }
    }
}

/// An embedded response: `HTTP/1.1 204 No Content`, headers, blank line, body.
fn embedded_response(text: &str) -> Result<SubResponse, String> {
    let (status_line, rest) = text
        .split_once('\n')
        .ok_or("an embedded response without a status line")?;
    let status = status_line
        .trim()
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.split(' ').next())
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or("an embedded response without a status")?;
    let (headers, body) = split_head(rest)?;
    Ok(SubResponse {
        status,
        headers,
        body: body.trim_end().as_bytes().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        Account::from_connection_string("UseDevelopmentStorage=true").unwrap()
    }

    fn batch() -> Batch {
        let table = TableName::try_new("ledger").unwrap();
        let fence = EntityTag::new("W/\"datetime'2026-11-21T14%3A00%3A00.1Z'\"");
        Batch::new(table, "book-1")
            .unwrap()
            .with(BatchOperation::Update(
                Entity::new("book-1", "fence").with("fencingToken", 7_i64),
                IfMatch::ETag(fence),
            ))
            .unwrap()
            .with(BatchOperation::Insert(
                Entity::new("book-1", "0001").with("fencingToken", 7_i64),
            ))
            .unwrap()
            .with(BatchOperation::Delete {
                row_key: "0000".into(),
                if_match: IfMatch::Any,
            })
            .unwrap()
    }

    #[test]
    fn the_batch_is_checked_as_it_is_built() {
        let mut b = Batch::new(TableName::try_new("ledger").unwrap(), "p").unwrap();
        for i in 0..MAX_BATCH_OPERATIONS {
            b.push(BatchOperation::Insert(Entity::new("p", format!("{i:03}"))))
                .unwrap();
        }
        let err = b
            .push(BatchOperation::Insert(Entity::new("p", "100")))
            .unwrap_err();
        assert!(err.to_string().contains("at most 100"), "{err}");
        assert_eq!(b.operations().len(), 100);
        let mut b = Batch::new(TableName::try_new("ledger").unwrap(), "p").unwrap();
        let other = b.push(BatchOperation::Insert(Entity::new("q", "1")));
        assert!(other.unwrap_err().to_string().contains("PartitionKey"));
        b.push(BatchOperation::Insert(Entity::new("p", "1")))
            .unwrap();
        let twice = b.push(BatchOperation::Delete {
            row_key: "1".into(),
            if_match: IfMatch::Any,
        });
        assert!(twice.unwrap_err().to_string().contains("once"));
        let empty = Batch::new(TableName::try_new("ledger").unwrap(), "p").unwrap();
        assert!(empty.request(&account()).is_err());
    }

    #[test]
    fn the_body_is_a_changeset_of_embedded_requests() {
        let r = batch().request(&account()).unwrap();
        assert_eq!(r.uri(), "http://127.0.0.1:10002/devstoreaccount1/$batch");
        let content_type = r.headers().get("content-type").unwrap();
        let boundary = boundary_of(content_type).unwrap();
        assert!(boundary.starts_with("batch_"));
        let body = std::str::from_utf8(r.body()).unwrap();
        assert!(body.starts_with(&format!(
            "--{boundary}\r\nContent-Type: multipart/mixed; boundary=changeset_"
        )));
        assert!(body.ends_with(&format!("--{boundary}--\r\n")));
        let parts = split_parts(body, &boundary).unwrap();
        assert_eq!(parts.len(), 1);
        let (head, inner) = split_head(parts[0]).unwrap();
        let changeset = boundary_of(head.get("content-type").unwrap()).unwrap();
        let ops = split_parts(inner, &changeset).unwrap();
        assert_eq!(ops.len(), 3);
        let (h, update) = split_head(ops[0]).unwrap();
        assert_eq!(h.get("content-id"), Some("1"));
        assert_eq!(h.get("content-type"), Some("application/http"));
        assert!(update.starts_with(
            "PUT http://127.0.0.1:10002/devstoreaccount1/ledger(PartitionKey='book-1',RowKey='fence') HTTP/1.1\r\n"
        ));
        assert!(update.contains("\r\nIf-Match: W/\"datetime'2026-11-21T14%3A00%3A00.1Z'\"\r\n"));
        assert!(
            update.contains("\"fencingToken\":\"7\",\"fencingToken@odata.type\":\"Edm.Int64\"")
                || update
                    .contains("\"fencingToken@odata.type\":\"Edm.Int64\",\"fencingToken\":\"7\"")
        );
        let (h, insert) = split_head(ops[1]).unwrap();
        assert_eq!(h.get("content-id"), Some("2"));
        assert!(
            insert.starts_with("POST http://127.0.0.1:10002/devstoreaccount1/ledger HTTP/1.1\r\n")
        );
        assert!(insert.contains("\r\nPrefer: return-no-content\r\n"));
        let (_, delete) = split_head(ops[2]).unwrap();
        assert!(delete.starts_with("DELETE "), "{delete}");
        assert!(delete.contains("\r\nIf-Match: *\r\n"));
        // The same batch, the same body.
        assert_eq!(batch().request(&account()).unwrap().body(), r.body());
    }

    fn answer(parts: &str) -> Response {
        let body = format!(
            "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n\
             {parts}--changesetresponse_2--\r\n--batchresponse_1--\r\n"
        );
        Response::new(StatusCode::ACCEPTED)
            .with_header("content-type", "multipart/mixed; boundary=batchresponse_1")
            .with_body(body.into_bytes())
    }

    fn part(status: &str, headers: &str, body: &str) -> String {
        format!(
            "--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
             HTTP/1.1 {status}\r\n{headers}\r\n{body}\r\n"
        )
    }

    #[test]
    fn a_committed_batch_answers_each_operation() {
        let ok = part("204 No Content", "ETag: W/\"datetime'x'\"\r\n", "");
        let r = answer(&format!("{ok}{ok}{}", part("204 No Content", "", "")));
        match batch().parse(&r).unwrap() {
            BatchOutcome::Committed(items) => {
                assert_eq!(items.len(), 3);
                assert_eq!(
                    items[0].etag.as_ref().unwrap().as_str(),
                    "W/\"datetime'x'\""
                );
                assert_eq!(items[2].etag, None);
            }
            other => panic!("{other:?}"),
        }
        // Fewer answers than operations is not a commit.
        assert!(batch().parse(&answer(&ok)).is_err());
    }

    #[test]
    fn a_failed_batch_names_the_operation_and_why() {
        let failed = part(
            "412 Precondition Failed",
            "Content-ID: 1\r\nContent-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n",
            r#"{"odata.error":{"code":"UpdateConditionNotSatisfied","message":{"lang":"en-US","value":"0:The update condition specified in the request was not satisfied."}}}"#,
        );
        assert_eq!(
            batch().parse(&answer(&failed)).unwrap(),
            BatchOutcome::Refused {
                index: Some(0),
                refusal: TableRefusal::ConditionNotMet
            }
        );
        // By Content-ID when the message does not say.
        let exists = part(
            "409 Conflict",
            "Content-ID: 2\r\n",
            r#"{"odata.error":{"code":"EntityAlreadyExists","message":{"value":"The specified entity already exists."}}}"#,
        );
        assert_eq!(
            batch().parse(&answer(&exists)).unwrap(),
            BatchOutcome::Refused {
                index: Some(1),
                refusal: TableRefusal::AlreadyExists
            }
        );
        // Not a condition: an error naming the operation.
        let bad = part(
            "400 Bad Request",
            "",
            r#"{"odata.error":{"code":"InvalidInput","message":{"value":"2:Bad value."}}}"#,
        );
        match batch().parse(&answer(&bad)).unwrap_err() {
            Error::Batch { index, error } => {
                assert_eq!(index, Some(2));
                assert_eq!(error.code.as_deref(), Some("InvalidInput"));
            }
            other => panic!("{other:?}"),
        }
        // The whole request refused: a plain storage error.
        let denied = Response::new(StatusCode::FORBIDDEN)
            .with_header("x-ms-error-code", "AuthenticationFailed");
        assert!(matches!(batch().parse(&denied), Err(Error::Storage(_))));
    }

    #[test]
    fn lf_only_answers_and_quoted_boundaries_are_read() {
        let body = "--b\nContent-Type: multipart/mixed; boundary=\"c\"\n\n--c\nContent-Type: application/http\n\nHTTP/1.1 204 No Content\nETag: W/\"e\"\n\n\n--c--\n--b--\n";
        let r = Response::new(StatusCode::ACCEPTED)
            .with_header("content-type", "multipart/mixed; boundary=b")
            .with_body(body.as_bytes().to_vec());
        let answers = sub_responses(&r).unwrap();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].status, StatusCode::NO_CONTENT);
        assert_eq!(answers[0].headers.get("etag"), Some("W/\"e\""));
    }
}
