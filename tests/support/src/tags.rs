//! Blob index tags as the model's storage keeps them: the `x-ms-tags` header of Put Blob (the
//! tags a write sets) and the `x-ms-if-tags` condition (a write, a read or a lease action done
//! only if the blob's tags meet it), by
//! [Put Blob](https://learn.microsoft.com/rest/api/storageservices/put-blob#request-headers-all-blob-types)
//! and [conditional headers on tags](https://learn.microsoft.com/rest/api/storageservices/specifying-conditional-headers-for-blob-service-operations#tags-conditional-operations).
//!
//! A condition is comparisons `"key" op 'value'` (`=`, `<>`, `<`, `<=`, `>`, `>=`) joined by
//! `AND`; values compare as strings (so a fencing token is zero-padded to a fixed width); a
//! comparison with a tag the blob does not have is false. `OR` and parentheses, which Azure
//! takes too, are refused as unsupported by the model (no protocol here sends them).

use std::collections::BTreeMap;

/// A blob's tags, keys to values.
pub type Tags = BTreeMap<String, String>;

/// The tags of an `x-ms-tags` header: `k=v&k2=v2`, each key and value percent-encoded (as a
/// query string; a `+` stays a `+`: tag values may hold it, and the core encodes a space as
/// `%20`). `None`: not a tag list (an empty key, more than 10 tags).
pub fn parse_header(value: &str) -> Option<Tags> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    };
    let mut tags = Tags::new();
    for pair in value.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(k)?;
        if key.is_empty() || tags.insert(key, decode(v)?).is_some() {
            return None;
        }
    }
    (tags.len() <= 10).then_some(tags)
}

/// A comparison of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One `"key" op 'value'`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Comparison {
    key: String,
    op: Op,
    value: String,
}

/// Reads a condition; `None`: not one the model takes (storage's 400).
fn parse(condition: &str) -> Option<Vec<Comparison>> {
    let mut rest = condition.trim();
    let mut out = Vec::new();
    loop {
        let (key, after) = quoted(rest, '"')?;
        let after = after.trim_start();
        let (op, after) = [
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("<>", Op::Ne),
            ("<", Op::Lt),
            (">", Op::Gt),
            ("=", Op::Eq),
        ]
        .into_iter()
        .find_map(|(text, op)| Some((op, after.strip_prefix(text)?)))?;
        let (value, after) = quoted(after.trim_start(), '\'')?;
        out.push(Comparison {
            key: key.to_string(),
            op,
            value: value.to_string(),
        });
        rest = after.trim_start();
        if rest.is_empty() {
            return Some(out);
        }
        let (word, after) = rest.split_at(rest.find(char::is_whitespace)?);
        if !word.eq_ignore_ascii_case("and") {
            return None;
        }
        rest = after.trim_start();
    }
}

/// `"text"` (or `'text'`) at the start of `s`: the text and what follows.
fn quoted(s: &str, quote: char) -> Option<(&str, &str)> {
    let inner = s.strip_prefix(quote)?;
    let end = inner.find(quote)?;
    Some((&inner[..end], &inner[end + 1..]))
}

/// Whether `tags` meet `condition`: `None` when the condition is malformed (or uses what the
/// model does not take).
pub fn holds(condition: &str, tags: &Tags) -> Option<bool> {
    let comparisons = parse(condition)?;
    Some(comparisons.iter().all(|c| {
        let Some(have) = tags.get(&c.key) else {
            // A tag the blob does not have: the comparison is false (whatever the operator).
            return false;
        };
        let have = have.as_str();
        let want = c.value.as_str();
        match c.op {
            Op::Eq => have == want,
            Op::Ne => have != want,
            Op::Lt => have < want,
            Op::Le => have <= want,
            Op::Gt => have > want,
            Op::Ge => have >= want,
        }
    }))
}

/// The keys a [Find Blobs by Tags](https://learn.microsoft.com/rest/api/storageservices/find-blobs-by-tags#remarks)
/// query compares, in order: a condition as for [`holds`], without `<>` (a find takes `=`,
/// `>`, `>=`, `<`, `<=`). `None`: not a query the model takes (storage's 400).
pub fn query_keys(query: &str) -> Option<Vec<String>> {
    let comparisons = parse(query)?;
    if comparisons.iter().any(|c| c.op == Op::Ne) {
        return None;
    }
    Some(comparisons.into_iter().map(|c| c.key).collect())
}

/// The body of Get Blob Tags.
pub fn tag_set_xml(tags: &Tags) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>{}",
        tags_element(tags)
    )
}

/// `<Tags><TagSet><Tag><Key/><Value/></Tag>...</TagSet></Tags>`: Get Blob Tags' body, and a
/// blob's tags in a listing (`include=tags`) or a find.
pub fn tags_element(tags: &Tags) -> String {
    let mut xml = String::from("<Tags><TagSet>");
    for (k, v) in tags {
        xml.push_str(&format!(
            "<Tag><Key>{}</Key><Value>{}</Value></Tag>",
            escape(k),
            escape(v)
        ));
    }
    xml.push_str("</TagSet></Tags>");
    xml
}

/// The tags of a Set Blob Tags body (`<Tags><TagSet><Tag><Key/><Value/></Tag>...`): a plain
/// scan, enough for the bodies the core writes (tag text needs no XML escape).
pub fn parse_tag_set_xml(body: &str) -> Option<Tags> {
    let mut tags = Tags::new();
    for tag in body.split("<Tag>").skip(1) {
        let inner = |name: &str| {
            let open = format!("<{name}>");
            let start = tag.find(&open)? + open.len();
            let end = tag[start..].find(&format!("</{name}>"))? + start;
            Some(tag[start..end].to_string())
        };
        let value = inner("Value").unwrap_or_default();
        tags.insert(inner("Key")?, value);
    }
    Some(tags)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_header_is_a_query_string() {
        assert_eq!(
            parse_header("leasegate_fence=00000000000000000007&a%20b=c%2Fd"),
            Some(tags(&[
                ("leasegate_fence", "00000000000000000007"),
                ("a b", "c/d")
            ]))
        );
        assert_eq!(parse_header(""), Some(Tags::new()));
        assert_eq!(parse_header("=v"), None);
        assert_eq!(parse_header("a=1&a=2"), None);
    }

    #[test]
    fn conditions_compare_strings_and_a_missing_tag_is_false() {
        let t = tags(&[("f", "00000000000000000007"), ("g", "b")]);
        let at = |c: &str| holds(c, &t).unwrap();
        assert!(at("\"f\" <= '00000000000000000007'"));
        assert!(at("\"f\" <= '00000000000000000010'"));
        assert!(!at("\"f\" <= '00000000000000000006'"));
        assert!(at("\"f\" < '00000000000000000008'"));
        assert!(!at("\"f\" < '00000000000000000007'"));
        assert!(at("\"f\"='00000000000000000007'"));
        assert!(at("\"f\" <> '1'"));
        assert!(at("\"f\" >= '00000000000000000007' AND \"g\" > 'a'"));
        assert!(!at("\"f\" >= '00000000000000000007' and \"g\" > 'b'"));
        // Strings, not numbers: "7" is above "10".
        assert!(!holds("\"n\" <= '10'", &tags(&[("n", "7")])).unwrap());
        // A missing tag makes any comparison false, <> included.
        assert!(!at("\"h\" <> 'x'"));
        assert!(!at("\"h\" < 'z'"));
    }

    #[test]
    fn malformed_or_unsupported_conditions_are_refused() {
        let t = Tags::new();
        for bad in [
            "",
            "f <= '1'",
            "\"f\" <= 1",
            "\"f\" == '1'",
            "\"f\" = '1' OR \"g\" = '2'",
            "\"f\" = '1' AND",
            "(\"f\" = '1')",
        ] {
            assert_eq!(holds(bad, &t), None, "{bad}");
        }
    }

    #[test]
    fn a_query_names_its_keys_and_takes_no_not_equal() {
        assert_eq!(
            query_keys("\"b\" <= '2' AND \"a\" = '1'"),
            Some(vec!["b".to_string(), "a".to_string()])
        );
        assert_eq!(query_keys("\"a\" <> '1'"), None);
        assert_eq!(query_keys("@container = 'c'"), None);
    }

    #[test]
    fn the_tag_set_round_trips() {
        let t = tags(&[("a", "1"), ("b", "")]);
        assert_eq!(parse_tag_set_xml(&tag_set_xml(&t)), Some(t));
    }
}
