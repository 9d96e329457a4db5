//! Reads of the Table service: a point read of one entity by its keys, and queries
//! (`$filter`, `$select`, `$top`) page by page with their continuation.

use percent_encoding::utf8_percent_encode;
use serde_json::Value;

use super::entity::{check_property_name, StoredEntity, TableName};
use super::ops::{
    endpoint, entity_path, etag_header, expect, json_body, request, TableOperation, ACCEPT,
};
use crate::account::Account;
use crate::error::ErrorClass;
use crate::message::{Method, Request, Response};
use crate::names::UNRESERVED;
use crate::Error;

/// A `$select` value: the keys, then the property names, comma-joined (checked, so none can
/// smuggle a query). The keys are always asked for, so every [`StoredEntity`] read has them.
fn select_value(select: &[String]) -> Result<Option<String>, Error> {
    if select.is_empty() {
        return Ok(None);
    }
    let mut names = vec!["PartitionKey", "RowKey"];
    for name in select {
        if !matches!(name.as_str(), "PartitionKey" | "RowKey" | "Timestamp") {
            check_property_name(name)?;
        }
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    Ok(Some(names.join(",")))
}

fn query_pair(name: &str, value: &str) -> String {
    format!("{name}={}", utf8_percent_encode(value, UNRESERVED))
}

/// [Query Entities](https://learn.microsoft.com/rest/api/storageservices/query-entities) of
/// one entity by its keys (a point read): `None` when it is not there.
#[derive(Debug, Clone)]
pub struct GetEntity {
    /// The table.
    pub table: TableName,
    /// The PartitionKey.
    pub partition_key: String,
    /// The RowKey.
    pub row_key: String,
    /// `$select`: the properties to return (empty: all; the keys always).
    pub select: Vec<String>,
}

impl TableOperation for GetEntity {
    type Output = Option<StoredEntity>;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let mut url = endpoint(account)?.url(&entity_path(
            &self.table,
            &self.partition_key,
            &self.row_key,
        )?);
        if let Some(select) = select_value(&self.select)? {
            url = format!("{url}?{}", query_pair("$select", &select));
        }
        Ok(request(
            Method::GET,
            url,
            vec![
                ("accept", ACCEPT.to_string()),
                ("dataserviceversion", "3.0".to_string()),
            ],
            Vec::new(),
        ))
    }
    fn parse(&self, response: &Response) -> Result<Option<StoredEntity>, Error> {
        match expect(response, &[200]) {
            Ok(()) => {}
            Err(Error::Storage(e)) if e.class == ErrorClass::EntityMissing => return Ok(None),
            Err(e) => return Err(e),
        }
        let object = json_body(response)?;
        StoredEntity::from_json(&object, etag_header(response))
            .map(Some)
            .map_err(|detail| Error::unexpected(response.status(), detail))
    }
}

/// Where a query's next page begins: the `x-ms-continuation-NextPartitionKey` and
/// `-NextRowKey` of the last answer, sent back as `NextPartitionKey` and `NextRowKey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// `NextPartitionKey`.
    pub next_partition_key: String,
    /// `NextRowKey` (storage may send the partition alone).
    pub next_row_key: Option<String>,
}

/// [Query Entities](https://learn.microsoft.com/rest/api/storageservices/query-entities):
/// one page of the entities matching `$filter`. A page can be short, or even empty, and still
/// have a continuation: loop while [`QueryPage::continuation`] is `Some`.
#[derive(Debug, Clone)]
pub struct QueryEntities {
    /// The table.
    pub table: TableName,
    /// `$filter`, an OData expression (`PartitionKey eq 'a' and n gt 5L`): build string
    /// literals with [`string_literal`], Int64 ones with [`int64_literal`].
    pub filter: Option<String>,
    /// `$select`: the properties to return (empty: all; the keys always).
    pub select: Vec<String>,
    /// `$top`: at most this many entities in the page (1 to 1000; the service's most is
    /// 1000).
    pub top: Option<u32>,
    /// Where to continue (from the last page).
    pub continuation: Option<Continuation>,
}

impl QueryEntities {
    /// A query of every entity of `table`.
    pub fn new(table: TableName) -> Self {
        QueryEntities {
            table,
            filter: None,
            select: Vec::new(),
            top: None,
            continuation: None,
        }
    }

    /// With `$filter`.
    pub fn with_filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = Some(filter.into());
        self
    }

    /// With `$select`.
    pub fn with_select(mut self, names: &[&str]) -> Self {
        self.select = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// With `$top`.
    pub fn with_top(mut self, top: u32) -> Self {
        self.top = Some(top);
        self
    }

    /// The query of the page after the one `page` answered, if there is one.
    pub fn next(&self, page: &QueryPage) -> Option<QueryEntities> {
        let continuation = page.continuation.clone()?;
        Some(QueryEntities {
            continuation: Some(continuation),
            ..self.clone()
        })
    }
}

/// One page of a query.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryPage {
    /// The entities, in key order.
    pub entities: Vec<StoredEntity>,
    /// Where the next page begins; `None` on the last page.
    pub continuation: Option<Continuation>,
}

/// `'text'` with each `'` doubled: an OData string literal for a `$filter`.
pub fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `123L`: an OData Int64 literal for a `$filter` (an Int64 property compared with an
/// unsuffixed number is compared as an Int32 by some peers).
pub fn int64_literal(value: i64) -> String {
    format!("{value}L")
}

impl TableOperation for QueryEntities {
    type Output = QueryPage;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let table = &self.table;
        let mut query = Vec::new();
        if let Some(filter) = &self.filter {
            query.push(query_pair("$filter", filter));
        }
        if let Some(select) = select_value(&self.select)? {
            query.push(query_pair("$select", &select));
        }
        if let Some(top) = self.top {
            if !(1..=1000).contains(&top) {
                return Err(Error::InvalidArgument("$top must be 1 to 1000".into()));
            }
            query.push(format!("$top={top}"));
        }
        if let Some(c) = &self.continuation {
            query.push(query_pair("NextPartitionKey", &c.next_partition_key));
            if let Some(row) = &c.next_row_key {
                query.push(query_pair("NextRowKey", row));
            }
        }
        let mut url = endpoint(account)?.url(&format!("/{table}()"));
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        Ok(request(
            Method::GET,
            url,
            vec![
                ("accept", ACCEPT.to_string()),
                ("dataserviceversion", "3.0".to_string()),
            ],
            Vec::new(),
        ))
    }
    fn parse(&self, response: &Response) -> Result<QueryPage, Error> {
        expect(response, &[200])?;
        let object = json_body(response)?;
        let unexpected = |detail: String| Error::unexpected(response.status(), detail);
        let values = match object.get("value") {
            Some(Value::Array(values)) => values,
            _ => return Err(unexpected("the answer has no \"value\" array".into())),
        };
        let entities = values
            .iter()
            .map(|v| match v {
                Value::Object(o) => StoredEntity::from_json(o, None),
                _ => Err("an entity that is not a JSON object".into()),
            })
            .collect::<Result<Vec<_>, String>>()
            .map_err(unexpected)?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let continuation =
            header("x-ms-continuation-nextpartitionkey").map(|next_partition_key| Continuation {
                next_partition_key,
                next_row_key: header("x-ms-continuation-nextrowkey"),
            });
        Ok(QueryPage {
            entities,
            continuation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::StatusCode;

    fn account() -> Account {
        Account::from_connection_string("UseDevelopmentStorage=true").unwrap()
    }

    fn table() -> TableName {
        TableName::try_new("ledger").unwrap()
    }

    #[test]
    fn entity_addresses_quote_and_encode_keys() {
        let get = GetEntity {
            table: table(),
            partition_key: "o'brien".into(),
            row_key: "a b,c".into(),
            select: vec!["fencingToken".into()],
        };
        let r = get.request(&account()).unwrap();
        assert_eq!(
            r.uri(),
            "http://127.0.0.1:10002/devstoreaccount1/ledger(PartitionKey='o%27%27brien',RowKey='a%20b%2Cc')?$select=PartitionKey%2CRowKey%2CfencingToken"
        );
        assert_eq!(r.headers().get("accept"), Some(ACCEPT));
        let bad = GetEntity {
            row_key: "a/b".into(),
            ..get.clone()
        };
        assert!(bad.request(&account()).is_err());
        let bad = GetEntity {
            select: vec!["a,b".into()],
            ..get
        };
        assert!(bad.request(&account()).is_err());
    }

    #[test]
    fn queries_carry_filter_top_and_continuation() {
        let q = QueryEntities::new(table())
            .with_filter(format!(
                "PartitionKey eq {} and n gt {}",
                string_literal("it's"),
                int64_literal(1 << 60)
            ))
            .with_top(2);
        let page = QueryPage {
            entities: vec![],
            continuation: Some(Continuation {
                next_partition_key: "1!8!aXQncw--".into(),
                next_row_key: Some("1!4!MDI-".into()),
            }),
        };
        let r = q.next(&page).unwrap().request(&account()).unwrap();
        assert_eq!(
            r.query().unwrap(),
            "$filter=PartitionKey%20eq%20%27it%27%27s%27%20and%20n%20gt%201152921504606846976L\
             &$top=2&NextPartitionKey=1%218%21aXQncw--&NextRowKey=1%214%21MDI-"
        );
        assert!(QueryEntities::new(table())
            .with_top(0)
            .request(&account())
            .is_err());
        let last = Response::new(StatusCode::OK).with_body(br#"{"value":[]}"#.to_vec());
        assert_eq!(q.parse(&last).unwrap().continuation, None);
    }
}
