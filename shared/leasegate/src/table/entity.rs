//! Tables, entities and their properties, and how they are written as JSON.
//!
//! Entities travel as [JSON with OData annotations](https://learn.microsoft.com/rest/api/storageservices/payload-format-for-table-service-operations):
//! a property whose type JSON cannot say carries a `"{name}@odata.type"` beside it. Requests
//! are written with an annotation for every such value, and answers asked with
//! `Accept: application/json;odata=minimalmetadata`, under which the service annotates them
//! back, so every [`EdmValue`] survives a round trip with its type.
//!
//! **Int64 values** (a fencing token, a counter) are written as a decimal *string* with
//! `"{name}@odata.type": "Edm.Int64"`: a JSON number loses integers above 2^53 in many
//! readers, and the service reads an unannotated integer as Int32 (or refuses it).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{Map, Value};

use crate::Error;

/// A table name: 3 to 63 ASCII letters and digits, starting with a letter, not `tables`
/// ([naming rules](https://learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model#table-names)).
/// Names are case-insensitive to storage and keep the case they were created with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// Validates a table name.
    pub fn try_new(name: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::InvalidName {
            what: "table name",
            reason: reason.to_string(),
        };
        if !(3..=63).contains(&name.len()) {
            return Err(bad("must be 3 to 63 characters"));
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(bad("only ASCII letters and digits are allowed"));
        }
        if !name.as_bytes()[0].is_ascii_alphabetic() {
            return Err(bad("must start with a letter"));
        }
        if name.eq_ignore_ascii_case("tables") {
            return Err(bad("'tables' is reserved"));
        }
        Ok(TableName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest PartitionKey or RowKey storage takes: 1 KiB (of UTF-16: 512 characters at
/// worst; checked here in UTF-8 bytes, which is stricter for ASCII-heavy keys than needed).
pub const MAX_KEY_BYTES: usize = 1024;

/// Whether storage takes `key` as a PartitionKey or RowKey: at most [`MAX_KEY_BYTES`], and
/// none of `/ \ # ?` or the control characters U+0000–U+001F, U+007F–U+009F
/// ([the data model](https://learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model#characters-disallowed-in-key-fields)).
/// `what` names the field in the error.
pub fn check_key(what: &'static str, key: &str) -> Result<(), Error> {
    let bad = |reason: &str| Error::InvalidName {
        what,
        reason: reason.to_string(),
    };
    if key.len() > MAX_KEY_BYTES {
        return Err(bad("must be at most 1024 bytes"));
    }
    if key
        .chars()
        .any(|c| matches!(c, '/' | '\\' | '#' | '?' | '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}'))
    {
        return Err(bad(
            "'/', '\\', '#', '?' and control characters are not allowed",
        ));
    }
    Ok(())
}

/// Whether `name` can be a property of ours: a C# identifier of ASCII letters, digits and
/// `_` (not starting with a digit), at most 255 characters, and not one of the system
/// properties `PartitionKey`, `RowKey`, `Timestamp` (each has its own field).
pub fn check_property_name(name: &str) -> Result<(), Error> {
    let bad = |reason: String| Error::InvalidName {
        what: "property name",
        reason,
    };
    if name.is_empty() || name.len() > 255 {
        return Err(bad("must be 1 to 255 characters".into()));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || name.as_bytes()[0].is_ascii_digit()
    {
        return Err(bad(format!(
            "'{name}' is not a C# identifier (ASCII letters, digits, '_')"
        )));
    }
    if ["PartitionKey", "RowKey", "Timestamp"]
        .iter()
        .any(|s| s.eq_ignore_ascii_case(name))
    {
        return Err(bad(format!("'{name}' is a system property")));
    }
    Ok(())
}

/// A property value with its [EDM type](https://learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model#property-types).
#[derive(Debug, Clone, PartialEq)]
pub enum EdmValue {
    /// `Edm.String`, UTF-8 (storage counts at most 32 K UTF-16 characters).
    String(String),
    /// `Edm.Int32`: a JSON number.
    Int32(i32),
    /// `Edm.Int64`: sent as a decimal string with its annotation (see the module docs).
    Int64(i64),
    /// `Edm.Double`, NaN and the infinities included (sent as strings).
    Double(f64),
    /// `Edm.Boolean`.
    Boolean(bool),
    /// `Edm.DateTime`, to 100 ns, UTC (`2026-11-21T14:00:00.1234567Z`).
    DateTime(SystemTime),
    /// `Edm.Guid`, in its hyphenated text form.
    Guid(String),
    /// `Edm.Binary`, sent base64-encoded.
    Binary(Vec<u8>),
}

impl EdmValue {
    /// The value if it is an `Edm.Int64` (or an `Edm.Int32`, widened).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            EdmValue::Int64(v) => Some(*v),
            EdmValue::Int32(v) => Some(i64::from(*v)),
            _ => None,
        }
    }

    /// The value if it is an `Edm.String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            EdmValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The annotation this value is sent with, if JSON alone would not say its type.
    fn odata_type(&self) -> Option<&'static str> {
        match self {
            EdmValue::String(_) | EdmValue::Int32(_) | EdmValue::Boolean(_) => None,
            EdmValue::Int64(_) => Some("Edm.Int64"),
            EdmValue::Double(_) => Some("Edm.Double"),
            EdmValue::DateTime(_) => Some("Edm.DateTime"),
            EdmValue::Guid(_) => Some("Edm.Guid"),
            EdmValue::Binary(_) => Some("Edm.Binary"),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            EdmValue::String(s) | EdmValue::Guid(s) => Value::String(s.clone()),
            EdmValue::Int32(v) => Value::from(*v),
            EdmValue::Int64(v) => Value::String(v.to_string()),
            EdmValue::Double(v) if v.is_nan() => Value::String("NaN".into()),
            EdmValue::Double(v) if v.is_infinite() => {
                Value::String(if *v > 0.0 { "Infinity" } else { "-Infinity" }.into())
            }
            EdmValue::Double(v) => Value::from(*v),
            EdmValue::Boolean(b) => Value::Bool(*b),
            EdmValue::DateTime(t) => Value::String(format_datetime(*t)),
            EdmValue::Binary(bytes) => Value::String(BASE64.encode(bytes)),
        }
    }

    /// Reads a JSON value with its annotation (`None`: JSON's own type decides, an integral
    /// number that fits being an Int32, as the service reads it).
    fn from_json(value: &Value, odata_type: Option<&str>) -> Result<EdmValue, String> {
        let text = || value.as_str().ok_or("a string");
        let edm = match (odata_type, value) {
            (None | Some("Edm.String"), Value::String(s)) => EdmValue::String(s.clone()),
            (None | Some("Edm.Boolean"), Value::Bool(b)) => EdmValue::Boolean(*b),
            (None | Some("Edm.Int32"), Value::Number(n)) if n.as_i64().is_some() => n
                .as_i64()
                .and_then(|v| i32::try_from(v).ok())
                .map(EdmValue::Int32)
                .ok_or("an Int32 out of range")?,
            (None, Value::Number(n)) => EdmValue::Double(n.as_f64().ok_or("a number")?),
            (Some("Edm.Double"), Value::Number(n)) => {
                EdmValue::Double(n.as_f64().ok_or("a number")?)
            }
            (Some("Edm.Double"), Value::String(s)) => EdmValue::Double(match s.as_str() {
                "NaN" => f64::NAN,
                "Infinity" | "INF" => f64::INFINITY,
                "-Infinity" | "-INF" => f64::NEG_INFINITY,
                other => other.parse().map_err(|_| "a Double")?,
            }),
            (Some("Edm.Int64"), Value::String(s)) => {
                EdmValue::Int64(s.parse().map_err(|_| "an Int64 in decimal")?)
            }
            (Some("Edm.Int64"), Value::Number(n)) => {
                EdmValue::Int64(n.as_i64().ok_or("an Int64 in decimal")?)
            }
            (Some("Edm.DateTime"), _) => EdmValue::DateTime(parse_datetime(text()?)?),
            (Some("Edm.Guid"), _) => EdmValue::Guid(text()?.to_string()),
            (Some("Edm.Binary"), _) => {
                EdmValue::Binary(BASE64.decode(text()?).map_err(|_| "base64")?)
            }
            (Some(other), _) => return Err(format!("an unknown type {other}")),
            (None, _) => return Err("null, an array or an object".into()),
        };
        Ok(edm)
    }
}

impl From<&str> for EdmValue {
    fn from(s: &str) -> Self {
        EdmValue::String(s.to_string())
    }
}

impl From<String> for EdmValue {
    fn from(s: String) -> Self {
        EdmValue::String(s)
    }
}

impl From<i32> for EdmValue {
    fn from(v: i32) -> Self {
        EdmValue::Int32(v)
    }
}

impl From<i64> for EdmValue {
    fn from(v: i64) -> Self {
        EdmValue::Int64(v)
    }
}

impl From<f64> for EdmValue {
    fn from(v: f64) -> Self {
        EdmValue::Double(v)
    }
}

impl From<bool> for EdmValue {
    fn from(v: bool) -> Self {
        EdmValue::Boolean(v)
    }
}

impl From<SystemTime> for EdmValue {
    fn from(v: SystemTime) -> Self {
        EdmValue::DateTime(v)
    }
}

/// `2026-11-21T14:00:00.1234567Z`: seconds and seven fraction digits (storage's 100 ns).
fn format_datetime(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = UNIX_EPOCH + Duration::from_secs(since.as_secs());
    let seconds = humantime::format_rfc3339_seconds(whole).to_string();
    let stem = seconds.trim_end_matches('Z');
    format!("{stem}.{:07}Z", since.subsec_nanos() / 100)
}

/// An ISO 8601 UTC time as storage writes them (`...T14:00:00Z`, up to 7 fraction digits).
fn parse_datetime(s: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339(s).map_err(|_| format!("'{s}' is not a UTC time"))
}

/// An entity's ETag, kept exactly as storage sent it (`W/"datetime'2026-11-21T14%3A00...Z'"`):
/// `If-Match` must name it byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityTag(String);

impl EntityTag {
    /// An ETag as an `ETag` header or an `odata.etag` carries it.
    pub fn new(raw: &str) -> Self {
        EntityTag(raw.trim().to_string())
    }

    /// The ETag as sent, for `If-Match`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An entity: its keys and its properties (at most 252 besides the system ones).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Entity {
    /// `PartitionKey`: entities with the same one can be written together ([`super::Batch`]).
    pub partition_key: String,
    /// `RowKey`: unique within the partition.
    pub row_key: String,
    /// The other properties, by name.
    pub properties: BTreeMap<String, EdmValue>,
}

impl Entity {
    /// An entity with these keys and no properties.
    pub fn new(partition_key: impl Into<String>, row_key: impl Into<String>) -> Self {
        Entity {
            partition_key: partition_key.into(),
            row_key: row_key.into(),
            properties: BTreeMap::new(),
        }
    }

    /// The entity with the property `name` set to `value`.
    pub fn with(mut self, name: &str, value: impl Into<EdmValue>) -> Self {
        self.properties.insert(name.to_string(), value.into());
        self
    }

    /// The property `name`.
    pub fn get(&self, name: &str) -> Option<&EdmValue> {
        self.properties.get(name)
    }

    /// Checks the keys and property names, for writing.
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_key("PartitionKey", &self.partition_key)?;
        check_key("RowKey", &self.row_key)?;
        if self.properties.len() > 252 {
            return Err(Error::InvalidArgument(
                "an entity has at most 252 properties of its own".into(),
            ));
        }
        self.properties
            .keys()
            .try_for_each(|name| check_property_name(name))
    }

    /// The JSON body of an insert, update, merge or upsert.
    pub(crate) fn to_json(&self) -> Result<Vec<u8>, Error> {
        self.check()?;
        let mut map = Map::new();
        map.insert("PartitionKey".into(), self.partition_key.clone().into());
        map.insert("RowKey".into(), self.row_key.clone().into());
        for (name, value) in &self.properties {
            if let Some(odata_type) = value.odata_type() {
                map.insert(format!("{name}@odata.type"), odata_type.into());
            }
            map.insert(name.clone(), value.to_json());
        }
        serde_json::to_vec(&Value::Object(map))
            .map_err(|_| Error::InvalidArgument("the entity cannot be written as JSON".into()))
    }
}

/// An entity as storage holds it: the entity, its ETag and its `Timestamp` (when storage
/// last wrote it).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEntity {
    /// The keys and properties.
    pub entity: Entity,
    /// The ETag, for a conditional update or delete (`If-Match`).
    pub etag: Option<EntityTag>,
    /// The `Timestamp` system property.
    pub timestamp: Option<SystemTime>,
}

impl StoredEntity {
    /// Reads one entity of a JSON answer (minimal or no metadata). `etag` is the answer's
    /// `ETag` header (a point read), used when the body has no `odata.etag`.
    pub(crate) fn from_json(
        object: &Map<String, Value>,
        etag: Option<EntityTag>,
    ) -> Result<StoredEntity, String> {
        let key = |name: &str| match object.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(format!("an entity without a string {name}")),
        };
        let mut entity = Entity::new(key("PartitionKey")?, key("RowKey")?);
        let mut timestamp = None;
        for (name, value) in object {
            if name.starts_with("odata.") || name.contains('@') {
                continue;
            }
            let annotation = object
                .get(&format!("{name}@odata.type"))
                .and_then(Value::as_str);
            match name.as_str() {
                "PartitionKey" | "RowKey" => {}
                "Timestamp" => {
                    timestamp = value.as_str().and_then(|s| parse_datetime(s).ok());
                }
                _ => {
                    let edm = EdmValue::from_json(value, annotation)
                        .map_err(|what| format!("property {name} is not {what}"))?;
                    entity.properties.insert(name.clone(), edm);
                }
            }
        }
        let etag = object
            .get("odata.etag")
            .and_then(Value::as_str)
            .map(EntityTag::new)
            .or(etag);
        Ok(StoredEntity {
            entity,
            etag,
            timestamp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for ok in ["abc", "Ledger2026", &"a".repeat(63)] {
            TableName::try_new(ok).unwrap();
        }
        for bad in [
            "ab",
            "1abc",
            "a-b",
            "a_b",
            "Tables",
            "tables",
            &"a".repeat(64),
        ] {
            assert!(TableName::try_new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_and_property_names() {
        check_key("RowKey", "").unwrap();
        check_key("RowKey", "o'brien, 2026-11-21 (é)").unwrap();
        for bad in ["a/b", "a\\b", "a#b", "a?b", "a\tb", "a\u{85}b"] {
            assert!(check_key("RowKey", bad).is_err(), "{bad:?}");
        }
        assert!(check_key("RowKey", &"k".repeat(1025)).is_err());
        check_property_name("fencingToken").unwrap();
        for bad in [
            "",
            "1a",
            "a-b",
            "a.b",
            "a@odata.type",
            "rowkey",
            "Timestamp",
        ] {
            assert!(check_property_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_type_round_trips_through_json() {
        let t = UNIX_EPOCH + Duration::new(1_795_096_800, 123_456_700);
        let entity = Entity::new("book-1", "0001")
            .with("token", i64::MAX)
            .with("count", 7)
            .with("ratio", 0.5)
            .with("whole", 2.0)
            .with("nan", f64::NAN)
            .with("flag", true)
            .with("at", t)
            .with("name", "O'Brien")
            .with(
                "id",
                EdmValue::Guid("2f2c4b1e-8d2a-4c55-9a10-6f3e1d0c9b7a".into()),
            )
            .with("bytes", EdmValue::Binary(vec![0, 1, 254, 255]));
        let json: Value = serde_json::from_slice(&entity.to_json().unwrap()).unwrap();
        assert_eq!(json["token"], "9223372036854775807");
        assert_eq!(json["token@odata.type"], "Edm.Int64");
        assert_eq!(json["count"], 7);
        assert!(json.get("count@odata.type").is_none());
        assert_eq!(json["at"], "2026-11-19T14:00:00.1234567Z");
        assert_eq!(json["nan"], "NaN");
        let back = StoredEntity::from_json(json.as_object().unwrap(), None).unwrap();
        let mut want = entity.clone();
        want.properties.remove("nan");
        let mut got = back.entity.clone();
        assert!(matches!(got.properties.remove("nan"), Some(EdmValue::Double(v)) if v.is_nan()));
        assert_eq!(got, want);
    }

    #[test]
    fn answers_are_read_with_their_metadata() {
        let body = serde_json::json!({
            "odata.etag": "W/\"datetime'2026-11-21T14%3A00%3A00.1234567Z'\"",
            "PartitionKey": "p", "RowKey": "r",
            "Timestamp@odata.type": "Edm.DateTime",
            "Timestamp": "2026-11-21T14:00:00.1234567Z",
            "big@odata.type": "Edm.Int64", "big": "9007199254740993",
            "small": 5, "frac": 1.5
        });
        let stored = StoredEntity::from_json(body.as_object().unwrap(), None).unwrap();
        assert_eq!(
            stored.entity.get("big").and_then(EdmValue::as_i64),
            Some(9_007_199_254_740_993)
        );
        assert_eq!(stored.entity.get("small"), Some(&EdmValue::Int32(5)));
        assert_eq!(stored.entity.get("frac"), Some(&EdmValue::Double(1.5)));
        assert_eq!(
            stored.etag.unwrap().as_str(),
            "W/\"datetime'2026-11-21T14%3A00%3A00.1234567Z'\""
        );
        assert!(stored.timestamp.is_some());
        let bad = serde_json::json!({"PartitionKey": "p", "RowKey": "r", "x@odata.type": "Edm.Int64", "x": "ten"});
        let err = StoredEntity::from_json(bad.as_object().unwrap(), None).unwrap_err();
        assert!(err.contains("property x"), "{err}");
    }
}
