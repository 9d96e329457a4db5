//! Validated names: containers, blobs and lock names (lock names, device ids, gate keys).
//!
//! A lock name comes from configuration or from a request (a device id, a gate key), so it is
//! untrusted: it is validated, then percent-encoded into a flat ASCII blob name below a prefix,
//! so no lock name can reach another prefix, climb a path or collide with another lock name.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::Error;

/// Bytes escaped everywhere this crate percent-encodes: all but RFC 3986 unreserved
/// (`A-Z a-z 0-9 - _ . ~`).
pub(crate) const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The longest lock name, in bytes (UTF-8). Percent-encoding can triple it; the blob name
/// stays well under Azure's 1024 characters.
pub const MAX_LOCK_NAME_BYTES: usize = 256;

/// A container name: 3 to 63 lowercase letters, digits and single dashes, starting and ending
/// with a letter or digit ([naming rules](https://learn.microsoft.com/rest/api/storageservices/naming-and-referencing-containers--blobs--and-metadata)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerName(String);

impl ContainerName {
    /// Validates a container name.
    pub fn try_new(name: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::InvalidName {
            what: "container name",
            reason: reason.to_string(),
        };
        if !(3..=63).contains(&name.len()) {
            return Err(bad("must be 3 to 63 characters"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(bad("only lowercase letters, digits and '-' are allowed"));
        }
        if name.starts_with('-')
            || name.ends_with('-')
            || name.as_bytes().windows(2).any(|w| w == b"--")
        {
            return Err(bad("'-' must stand between letters or digits"));
        }
        Ok(ContainerName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ContainerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A blob name: 1 to 1024 characters, no control characters, no `.` or `..` segment, with both
/// `/` and `\` taken as separators (a URL cannot carry those reliably: clients and servers
/// resolve them, some after turning `\` into `/`). Everything else storage
/// accepts is a name here, `a//b`, `dir/` and `a\b` included: each segment is percent-encoded
/// on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobName(String);

impl BlobName {
    /// Validates a blob name.
    pub fn try_new(name: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::InvalidName {
            what: "blob name",
            reason: reason.to_string(),
        };
        if name.is_empty() || name.chars().count() > 1024 {
            return Err(bad("must be 1 to 1024 characters"));
        }
        if name.chars().any(char::is_control) {
            return Err(bad("control characters are not allowed"));
        }
        // `\` counts as a separator here too: some clients and servers treat it as one.
        if name.split(['/', '\\']).any(|seg| seg == "." || seg == "..") {
            return Err(bad(
                "'.' and '..' path segments (between '/' or '\\') are not allowed",
            ));
        }
        Ok(BlobName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name percent-encoded for a URL path, `/` kept as the separator.
    pub fn url_path(&self) -> String {
        encode_path(&self.0)
    }
}

impl std::fmt::Display for BlobName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A lock name, device id or gate key: 1 to [`MAX_LOCK_NAME_BYTES`] bytes of UTF-8 without
/// control characters or `\`; `/` separates segments, none of them empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockName(String);

impl LockName {
    /// Validates a lock name.
    pub fn try_new(name: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::InvalidName {
            what: "lock name",
            reason,
        };
        if name.is_empty() {
            return Err(bad("must not be empty".into()));
        }
        if name.len() > MAX_LOCK_NAME_BYTES {
            return Err(bad(format!(
                "must be at most {MAX_LOCK_NAME_BYTES} bytes, got {}",
                name.len()
            )));
        }
        if name.chars().any(char::is_control) {
            return Err(bad("control characters are not allowed".into()));
        }
        if let Some(c) = name.chars().find(|&c| is_format_or_separator(c)) {
            return Err(bad(format!(
                "format and separator characters are not allowed (U+{:04X})",
                u32::from(c)
            )));
        }
        if name.contains('\\') {
            return Err(bad("'\\' is not allowed".into()));
        }
        if name
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return Err(bad(
                "empty, '.' and '..' segments are not allowed (no leading, trailing or double '/')"
                    .into(),
            ));
        }
        Ok(LockName(name.to_string()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The blob that holds this lock: `prefix` followed by each segment percent-encoded
    /// (unreserved characters kept), joined by `/`. The mapping is one-to-one.
    pub fn blob_name(&self, prefix: &str) -> Result<BlobName, Error> {
        let encoded: Vec<String> = self
            .0
            .split('/')
            .map(|seg| utf8_percent_encode(seg, UNRESERVED).to_string())
            .collect();
        BlobName::try_new(&format!("{prefix}{}", encoded.join("/")))
    }

    /// The lock a listed blob holds: the inverse of [`LockName::blob_name`] (`prefix` taken
    /// off, each segment percent-decoded). `None` for a blob that is not the lock blob of any
    /// lock under `prefix`: another prefix, a name that does not decode to a valid lock name,
    /// or one that [`LockName::blob_name`] would not write (`%41` for `A`), so that each lock
    /// blob names exactly one lock.
    pub fn from_blob_name(blob: &str, prefix: &str) -> Option<LockName> {
        let rest = blob.strip_prefix(prefix)?;
        let segments: Option<Vec<String>> = rest
            .split('/')
            .map(|seg| {
                percent_encoding::percent_decode_str(seg)
                    .decode_utf8()
                    .ok()
                    .map(|s| s.into_owned())
            })
            .collect();
        let lock = LockName::try_new(&segments?.join("/")).ok()?;
        (lock.blob_name(prefix).ok()?.as_str() == blob).then_some(lock)
    }
}

impl std::fmt::Display for LockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `c` is a Unicode format character (category Cf: U+200B zero width space, U+202E
/// right-to-left override, U+FEFF, ...) or a line or paragraph separator (Zl U+2028, Zp
/// U+2029). Such characters are invisible or reorder text: in an id or a key they make log
/// lines and notifications show something other than what they hold. The ranges are those of
/// [Unicode 16.0](https://www.unicode.org/Public/16.0.0/ucd/extracted/DerivedGeneralCategory.txt).
pub fn is_format_or_separator(c: char) -> bool {
    const RANGES: [(u32, u32); 21] = [
        (0xAD, 0xAD),
        (0x600, 0x605),
        (0x61C, 0x61C),
        (0x6DD, 0x6DD),
        (0x70F, 0x70F),
        (0x890, 0x891),
        (0x8E2, 0x8E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x2028, 0x202E), // Zl, Zp, then the embedding controls (Cf)
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let c = u32::from(c);
    RANGES.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// Percent-encodes a path, keeping `/` between segments. Everything else but unreserved bytes,
/// `%` included, is escaped, so a blob name containing `%41` is sent as `%2541`.
pub(crate) fn encode_path(path: &str) -> String {
    path.split('/')
        .map(|seg| utf8_percent_encode(seg, UNRESERVED).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_names() {
        for ok in ["abc", "leasegate", "a-b-c", "x1y2", &"a".repeat(63)] {
            ContainerName::try_new(ok).unwrap();
        }
        for bad in [
            "ab",
            "ABC",
            "a--b",
            "-ab",
            "ab-",
            "a_b",
            "a.b",
            &"a".repeat(64),
        ] {
            assert!(ContainerName::try_new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn format_and_separator_characters_are_refused() {
        for bad in [
            "a\u{202e}b",
            "a\u{2028}b",
            "a\u{2029}b",
            "\u{feff}k",
            "a\u{ad}b",
            "a\u{200b}",
        ] {
            let e = LockName::try_new(bad).unwrap_err().to_string();
            assert!(e.contains("format and separator"), "{bad:?}: {e}");
        }
        for ok in ["capteur-é", "東京/1", "a b", "emoji-🙂"] {
            LockName::try_new(ok).unwrap();
        }
    }

    #[test]
    fn lock_names_are_encoded_flat() {
        let n = LockName::try_new("device/sensor 1?#%").unwrap();
        let b = n.blob_name("locks/").unwrap();
        assert_eq!(b.as_str(), "locks/device/sensor%201%3F%23%25");
        assert_eq!(b.url_path(), "locks/device/sensor%25201%253F%2523%2525");
        let u = LockName::try_new("température").unwrap();
        assert_eq!(u.blob_name("").unwrap().as_str(), "temp%C3%A9rature");
    }

    #[test]
    fn a_lock_blob_names_its_lock() {
        for name in [
            "device/sensor 1?#%",
            "température",
            "gates/a/b",
            "a%2Fb",
            "東京/1",
        ] {
            let lock = LockName::try_new(name).unwrap();
            for prefix in ["", "gates/", "locks/"] {
                let blob = lock.blob_name(prefix).unwrap();
                assert_eq!(
                    LockName::from_blob_name(blob.as_str(), prefix),
                    Some(lock.clone()),
                    "{name} under {prefix}"
                );
            }
        }
        for (blob, prefix) in [
            ("gates/a", "alerts/"),
            ("gates/%41", "gates/"),
            ("gates/a b", "gates/"),
            ("gates/%FF", "gates/"),
            ("gates/a/%2E%2E", "gates/"),
            ("gates/", "gates/"),
            ("gates/a//b", "gates/"),
            ("gates/%0A", "gates/"),
        ] {
            assert_eq!(LockName::from_blob_name(blob, prefix), None, "{blob}");
        }
    }

    #[test]
    fn lock_names_refuse_traversal_and_junk() {
        let long = "x".repeat(MAX_LOCK_NAME_BYTES + 1);
        let cases = [
            ("", "empty"),
            ("..", "segments"),
            ("a/../b", "segments"),
            ("/a", "segments"),
            ("a/", "segments"),
            ("a//b", "segments"),
            ("./a", "segments"),
            ("a\\b", "'\\'"),
            ("a\nb", "control"),
            ("a\u{0}b", "control"),
            (long.as_str(), "at most 256 bytes"),
        ];
        for (name, want) in cases {
            let err = LockName::try_new(name).unwrap_err().to_string();
            assert!(err.starts_with("invalid lock name"), "{err}");
            assert!(err.contains(want), "{name:?}: {err}");
        }
        LockName::try_new(&"x".repeat(MAX_LOCK_NAME_BYTES)).unwrap();
        LockName::try_new("a..b/c.d").unwrap();
    }

    #[test]
    fn blob_names_take_what_storage_takes_but_dot_segments() {
        for (ok, path) in [
            ("a//b", "a//b"),
            ("dir/", "dir/"),
            ("a\\b", "a%5Cb"),
            ("/lead", "/lead"),
            ("a..b/.c", "a..b/.c"),
        ] {
            assert_eq!(BlobName::try_new(ok).unwrap().url_path(), path, "{ok}");
        }
        for bad in ["", ".", "..", "a/./b", "a/../b", "x/..", "a\nb"] {
            assert!(BlobName::try_new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn blob_names_refuse_dot_segments_split_on_backslash() {
        // Servers and clients may treat `\` as a separator: `logs/..\..\other/x` starts with
        // a swept prefix but may name a blob outside it.
        for bad in [
            "logs/..\\..\\other/x",
            "a\\..",
            "..\\a",
            "a\\.\\b",
            "a/.\\b",
        ] {
            let e = BlobName::try_new(bad).unwrap_err().to_string();
            assert!(e.contains("segments"), "{bad:?}: {e}");
        }
        for ok in ["a\\b", "a..\\b", "a\\.b", "\\lead"] {
            BlobName::try_new(ok).unwrap();
        }
    }

    #[test]
    fn distinct_names_give_distinct_blobs() {
        let a = LockName::try_new("a%2Fb").unwrap().blob_name("l/").unwrap();
        let b = LockName::try_new("a/b").unwrap().blob_name("l/").unwrap();
        assert_ne!(a, b);
    }
}
