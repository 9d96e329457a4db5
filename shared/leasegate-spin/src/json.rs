//! JSON for the components: a value type, a reader and a writer, and [`json!`](crate::json!).
//!
//! The components used serde_json; its reader (serde's visitors), its map (a B-tree) and its
//! macro (`to_value(&leaf).unwrap()` per leaf) were 17-70 KB of each component. This module does
//! what they need in a few KB:
//! * [`Value`]: `null`, booleans, numbers, strings, arrays and objects. An object keeps its keys
//!   in insertion order (a second insert of a key replaces its value in place); two objects are
//!   equal when they hold the same keys and values, in any order.
//! * [`from_slice`]: RFC 8259 JSON in UTF-8, nesting at most [`MAX_DEPTH`] deep, objects of at
//!   most [`MAX_KEYS`] keys; errors say what was expected and where (line and column). Integers
//!   read exactly (`u64`, or `i64` when negative); other numbers as `f64`, exactly when they have
//!   at most 15 significant digits and a decimal exponent within 22 (Clinger's fast path),
//!   otherwise to within a few units in the last place (numbers within a few units of `f64::MAX`
//!   may be refused as out of range).
//! * `Display` writes compact JSON, [`to_pretty`] indents by two spaces; numbers are written as
//!   serde_json writes them (`f64` the shortest way that reads back the same).
//! * [`json!`](crate::json!) takes serde_json's macro syntax; each leaf is converted by
//!   [`ToJson`].

use std::fmt::{self, Write as _};

/// How deep arrays and objects may nest in what [`from_slice`] reads (serde_json's limit).
pub const MAX_DEPTH: usize = 128;

/// How many keys an object may have in what [`from_slice`] reads. Each key is checked against
/// the ones before it (a repeated key replaces the value, as in serde_json), so the limit keeps
/// a hostile body from costing quadratic time; records and requests have a few dozen at most.
pub const MAX_KEYS: usize = 1000;
// The reader's message names the limit.
const _: () = assert!(MAX_KEYS == 1000);

/// A JSON value.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    /// `null`.
    #[default]
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number.
    Number(Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object.
    Object(Map),
}

/// A JSON number: an integer kept exactly, or a finite `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Number(N);

#[derive(Debug, Clone, Copy, PartialEq)]
enum N {
    Unsigned(u64),
    /// Always negative.
    Signed(i64),
    /// Always finite.
    Float(f64),
}

impl Number {
    /// A finite `f64`; `None` for NaN and the infinities, which JSON cannot write.
    pub fn from_f64(x: f64) -> Option<Number> {
        x.is_finite().then_some(Number(N::Float(x)))
    }

    /// The number if it is an integer from 0 to `u64::MAX`.
    pub fn as_u64(&self) -> Option<u64> {
        match self.0 {
            N::Unsigned(n) => Some(n),
            _ => None,
        }
    }

    /// The number if it is an integer that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self.0 {
            N::Unsigned(n) => i64::try_from(n).ok(),
            N::Signed(n) => Some(n),
            N::Float(_) => None,
        }
    }

    /// The number as an `f64` (integers beyond 2^53 rounded).
    pub fn as_f64(&self) -> Option<f64> {
        Some(match self.0 {
            N::Unsigned(n) => n as f64,
            N::Signed(n) => n as f64,
            N::Float(x) => x,
        })
    }
}

impl From<u64> for Number {
    fn from(n: u64) -> Number {
        Number(N::Unsigned(n))
    }
}

impl From<i64> for Number {
    fn from(n: i64) -> Number {
        match u64::try_from(n) {
            Ok(u) => Number(N::Unsigned(u)),
            Err(_) => Number(N::Signed(n)),
        }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            N::Unsigned(n) => write!(f, "{n}"),
            N::Signed(n) => write!(f, "{n}"),
            N::Float(x) => f.write_str(zmij::Buffer::new().format_finite(x)),
        }
    }
}

/// A JSON object: keys in insertion order, each once.
#[derive(Debug, Clone, Default)]
pub struct Map(Vec<(String, Value)>);

impl Map {
    /// An empty object.
    pub fn new() -> Map {
        Map(Vec::new())
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of `key`, to change.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.0.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key` (in place if it is there, last otherwise); returns the value it replaced.
    pub fn insert(&mut self, key: String, value: Value) -> Option<Value> {
        match self.get_mut(&key) {
            Some(v) => Some(std::mem::replace(v, value)),
            None => {
                self.0.push((key, value));
                None
            }
        }
    }

    /// Takes `key` out.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    /// Whether `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The keys and values, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The values, in order.
    pub fn values(&self) -> impl Iterator<Item = &Value> {
        self.0.iter().map(|(_, v)| v)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl PartialEq for Map {
    fn eq(&self, other: &Map) -> bool {
        self.len() == other.len() && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

static NULL: Value = Value::Null;

impl Value {
    /// The value of `key` in an object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object()?.get(key)
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The number, if this is an integer from 0 to `u64::MAX`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    /// The number, if this is an integer that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    /// The number as an `f64`, if this is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(n) => n.as_f64(),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The object, if this is one.
    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The object, to change, if this is one.
    pub fn as_object_mut(&mut self) -> Option<&mut Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&Vec<Value>> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Sets `key` (as `value["key"] = v` does, without the indexing operator's caller location:
    /// a 16-byte record and its argument at every assignment).
    pub fn set(&mut self, key: &str, value: Value) {
        if !matches!(self, Value::Object(_)) {
            *self = Value::Object(Map::new());
        }
        if let Value::Object(m) = self {
            m.insert(key.to_owned(), value);
        }
    }

    /// Whether this is an object.
    pub fn is_object(&self) -> bool {
        matches!(self, Value::Object(_))
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The value at a path of object keys (`&["Data", "timer"]`).
    pub fn at(&self, path: &[&str]) -> Option<&Value> {
        let mut at = self;
        for key in path {
            at = at.get(key)?;
        }
        Some(at)
    }

    /// The value at a JSON pointer (RFC 6901: `/Data/timer`, `~1` for `/`, `~0` for `~`).
    pub fn pointer(&self, pointer: &str) -> Option<&Value> {
        if pointer.is_empty() {
            return Some(self);
        }
        let mut at = self;
        for token in pointer.strip_prefix('/')?.split('/') {
            let token = unescape_pointer(token);
            at = match at {
                Value::Object(m) => m.get(&token)?,
                Value::Array(a) => a.get(token.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(at)
    }
}

macro_rules! equal_to {
    ($($t:ty => |$o:ident| $as:expr),*) => {$(
        /// Comparisons with plain values, as in serde_json (`v["state"] == "done"`).
        impl PartialEq<$t> for Value {
            fn eq(&self, $o: &$t) -> bool {
                *self == $as
            }
        }
    )*};
}
equal_to!(
    str => |o| Value::String(o.to_owned()),
    &str => |o| Value::String((*o).to_owned()),
    String => |o| Value::String(o.clone()),
    u64 => |o| Value::Number(Number::from(*o)),
    i64 => |o| Value::Number(Number::from(*o)),
    bool => |o| Value::Bool(*o)
);

/// A JSON pointer's token: `~1` is `/`, `~0` is `~`.
fn unescape_pointer(token: &str) -> String {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('~', Some('1')) => {
                out.push('/');
                chars.next();
            }
            ('~', Some('0')) => {
                out.push('~');
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// `value["key"]`: the key's value, `null` when this is no object or lacks the key.
impl std::ops::Index<&str> for Value {
    type Output = Value;
    fn index(&self, key: &str) -> &Value {
        self.get(key).unwrap_or(&NULL)
    }
}

/// `value[i]`: the element, `null` when this is no array or is shorter.
impl std::ops::Index<usize> for Value {
    type Output = Value;
    fn index(&self, i: usize) -> &Value {
        self.as_array().and_then(|a| a.get(i)).unwrap_or(&NULL)
    }
}

/// `value["key"] = ...`: sets the key, adding it (as `null`) if missing. A value that is no
/// object becomes an empty one first (serde_json would panic).
impl std::ops::IndexMut<&str> for Value {
    fn index_mut(&mut self, key: &str) -> &mut Value {
        if !matches!(self, Value::Object(_)) {
            *self = Value::Object(Map::new());
        }
        let Value::Object(m) = self else {
            unreachable!("made an object above")
        };
        let i = match m.0.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                m.0.push((key.to_owned(), Value::Null));
                m.0.len() - 1
            }
        };
        &mut m.0[i].1
    }
}

/// Compact JSON.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        write(&mut out, self, None, 0);
        f.write_str(&out)
    }
}

/// JSON indented by two spaces, as serde_json's `to_vec_pretty` writes it.
pub fn to_pretty(value: &Value) -> String {
    let mut out = String::new();
    write(&mut out, value, Some(2), 0);
    out
}

fn write(out: &mut String, value: &Value, indent: Option<usize>, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_str(out, s),
        Value::Array(a) => write_items(
            out,
            ('[', ']'),
            a.iter().map(|v| (None, v)),
            a.is_empty(),
            indent,
            depth,
        ),
        Value::Object(m) => write_items(
            out,
            ('{', '}'),
            m.iter().map(|(k, v)| (Some(k.as_str()), v)),
            m.is_empty(),
            indent,
            depth,
        ),
    }
}

fn write_items<'a>(
    out: &mut String,
    (open, close): (char, char),
    items: impl Iterator<Item = (Option<&'a str>, &'a Value)>,
    empty: bool,
    indent: Option<usize>,
    depth: usize,
) {
    out.push(open);
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    };
    for (i, (key, value)) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        newline(out, depth + 1);
        if let Some(key) = key {
            write_str(out, key);
            out.push_str(if indent.is_some() { ": " } else { ":" });
        }
        write(out, value, indent, depth + 1);
    }
    if !empty {
        newline(out, depth);
    }
    out.push(close);
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            // Control characters, and the format and separator characters that reorder or
            // break text where it is shown (U+202E, U+2028, ...): text from users (blob names)
            // reaches answers and log lines escaped.
            // Above U+FFFF: a UTF-16 surrogate pair (`\\u` takes four hex digits).
            c if c.is_control() || leasegate::is_format_or_separator(c) => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    let _ = write!(out, "\\u{:04x}", unit);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Why [`from_slice`] refused its input: what it expected, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    what: &'static str,
    line: usize,
    column: usize,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at line {} column {}",
            self.what, self.line, self.column
        )
    }
}

impl std::error::Error for Error {}

/// Reads one JSON value (surrounding whitespace allowed, nothing else).
pub fn from_slice(input: &[u8]) -> Result<Value, Error> {
    let mut reader = Reader { input, at: 0 };
    if std::str::from_utf8(input).is_err() {
        let valid = std::str::from_utf8(input)
            .err()
            .map_or(0, |e| e.valid_up_to());
        reader.at = valid;
        return Err(reader.error("invalid UTF-8"));
    }
    let value = reader.value(0)?;
    reader.skip_whitespace();
    if reader.at < input.len() {
        return Err(reader.error("trailing characters"));
    }
    Ok(value)
}

struct Reader<'a> {
    input: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, what: &'static str) -> Error {
        let before = &self.input[..self.at.min(self.input.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        Error {
            what,
            line,
            column: self.at - line_start + 1,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.skip_whitespace();
        let found = self.peek() == Some(b);
        if found {
            self.at += 1;
        }
        found
    }

    fn literal(&mut self, word: &[u8], value: Value) -> Result<Value, Error> {
        if self.input[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.error("expected value"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, Error> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'n') => self.literal(b"null", Value::Null),
            Some(b't') => self.literal(b"true", Value::Bool(true)),
            Some(b'f') => self.literal(b"false", Value::Bool(false)),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number().map(Value::Number),
            Some(open @ (b'[' | b'{')) => {
                if depth >= MAX_DEPTH {
                    return Err(self.error("nested too deep"));
                }
                self.at += 1;
                let close = if open == b'[' { b']' } else { b'}' };
                let mut array = Vec::new();
                let mut object = Map::new();
                if !self.eat(close) {
                    loop {
                        if open == b'[' {
                            array.push(self.value(depth + 1)?);
                        } else {
                            self.skip_whitespace();
                            if self.peek() != Some(b'"') {
                                return Err(self.error("expected a string key"));
                            }
                            if object.len() == MAX_KEYS {
                                return Err(self.error("an object has more than 1000 keys"));
                            }
                            let key = self.string()?;
                            if !self.eat(b':') {
                                return Err(self.error("expected `:`"));
                            }
                            object.insert(key, self.value(depth + 1)?);
                        }
                        if self.eat(close) {
                            break;
                        }
                        if !self.eat(b',') {
                            return Err(self.error(if open == b'[' {
                                "expected `,` or `]`"
                            } else {
                                "expected `,` or `}`"
                            }));
                        }
                    }
                }
                Ok(if open == b'[' {
                    Value::Array(array)
                } else {
                    Value::Object(object)
                })
            }
            Some(_) => Err(self.error("expected value")),
            None => Err(self.error("EOF while parsing a value")),
        }
    }

    /// A string; `self.at` is at its opening quote. The input is valid UTF-8.
    fn string(&mut self) -> Result<String, Error> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let Some(b) = self.peek() else {
                return Err(self.error("EOF while parsing a string"));
            };
            self.at += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(e) = self.peek() else {
                        return Err(self.error("EOF while parsing a string"));
                    };
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => {
                            self.at -= 1;
                            return Err(self.error("invalid escape"));
                        }
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => {
                    self.at -= 1;
                    return Err(self.error("control character in a string"));
                }
                _ => out.push(b),
            }
        }
        // Whole characters of valid UTF-8 input and whole encoded escapes: still valid.
        String::from_utf8(out).map_err(|_| self.error("invalid UTF-8"))
    }

    /// After `\u`: four hex digits, and a low surrogate's escape after a high one.
    fn unicode_escape(&mut self) -> Result<char, Error> {
        let first = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&first) {
            if !self.input[self.at..].starts_with(b"\\u") {
                return Err(self.error("lone leading surrogate in a \\u escape"));
            }
            self.at += 2;
            let second = self.hex4()?;
            if !(0xDC00..0xE000).contains(&second) {
                return Err(self.error("invalid low surrogate in a \\u escape"));
            }
            0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
        } else {
            first
        };
        char::from_u32(code).ok_or_else(|| self.error("invalid \\u escape"))
    }

    fn hex4(&mut self) -> Result<u32, Error> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self.peek().and_then(|b| char::from(b).to_digit(16));
            let Some(digit) = digit else {
                return Err(self.error("invalid \\u escape"));
            };
            code = code * 16 + digit;
            self.at += 1;
        }
        Ok(code)
    }

    /// Moves past a run of digits; returns where it began.
    fn skip_digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        start
    }

    fn number(&mut self) -> Result<Number, Error> {
        let input = self.input;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let whole = &input[self.skip_digits()..self.at];
        if whole.is_empty() {
            return Err(self.error("invalid number"));
        }
        if whole.len() > 1 && whole[0] == b'0' {
            self.at -= whole.len() - 1;
            return Err(self.error("invalid number"));
        }
        let mut fraction: &[u8] = &[];
        if self.peek() == Some(b'.') {
            self.at += 1;
            fraction = &input[self.skip_digits()..self.at];
            if fraction.is_empty() {
                return Err(self.error("invalid number"));
            }
        }
        let mut exponent: i64 = 0;
        let has_exponent = matches!(self.peek(), Some(b'e' | b'E'));
        if has_exponent {
            self.at += 1;
            let minus = self.peek() == Some(b'-');
            if matches!(self.peek(), Some(b'-' | b'+')) {
                self.at += 1;
            }
            let digits = &input[self.skip_digits()..self.at];
            if digits.is_empty() {
                return Err(self.error("invalid number"));
            }
            for &d in digits {
                // Capped far beyond any digit run a body can hold (which the scale below
                // offsets against it), and far from overflowing.
                exponent = (exponent * 10 + i64::from(d - b'0')).min(1 << 40);
            }
            if minus {
                exponent = -exponent;
            }
        }
        if fraction.is_empty() && !has_exponent {
            let mut n: u64 = 0;
            let fits = whole.iter().all(|&d| {
                n.checked_mul(10)
                    .and_then(|n10| n10.checked_add(u64::from(d - b'0')))
                    .map(|next| n = next)
                    .is_some()
            });
            if fits && !negative {
                return Ok(Number(N::Unsigned(n)));
            }
            if fits && n != 0 && n <= 1 << 63 {
                return Ok(Number(N::Signed((n as i64).wrapping_neg())));
            }
        }
        // At most 19 significant digits make the mantissa; further whole digits raise the
        // scale, further fraction digits are dropped.
        let mut mantissa: u64 = 0;
        let mut kept = 0;
        let mut scale = exponent;
        for (i, &d) in whole.iter().chain(fraction).enumerate() {
            let in_fraction = i >= whole.len();
            if kept < 19 {
                mantissa = mantissa * 10 + u64::from(d - b'0');
                if mantissa != 0 {
                    kept += 1;
                }
                if in_fraction {
                    scale -= 1;
                }
            } else if !in_fraction {
                scale += 1;
            }
        }
        // Scaled by exact powers of ten, at most 10^22 a step. One step (a mantissa below 2^53,
        // a scale within 22: up to 15 significant digits) is Clinger's fast path, correctly
        // rounded; more steps round each, within a few units in the last place.
        let mut value = mantissa as f64;
        let mut left = scale.clamp(-800, 800);
        while left != 0 && value != 0.0 && value.is_finite() {
            let step = left.clamp(-22, 22);
            let power = 10f64.powi(step.unsigned_abs() as i32);
            value = if step < 0 {
                value / power
            } else {
                value * power
            };
            left -= step;
        }
        let value = if negative { -value } else { value };
        Number::from_f64(value).ok_or_else(|| self.error("number out of range"))
    }
}

/// Reads an object's fields, with errors that name the field: for records kept in blobs and
/// for request bodies. A `null` field counts as missing.
pub struct Fields<'a>(&'a Map);

impl<'a> Fields<'a> {
    /// The fields of `value`, which must be an object.
    pub fn of(value: &'a Value) -> Result<Fields<'a>, String> {
        value
            .as_object()
            .map(Fields)
            .ok_or_else(|| "expected a JSON object".to_owned())
    }

    fn present(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    /// Refuses keys other than `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            Some((k, _)) => Err(format!(
                "unknown field `{k}`, expected one of {}",
                known.join(", ")
            )),
            None => Ok(()),
        }
    }

    /// A string field that may be missing.
    pub fn opt_string(&self, key: &str) -> Result<Option<String>, String> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{key} must be a string")),
        }
    }

    /// A string field.
    pub fn string(&self, key: &str) -> Result<String, String> {
        self.opt_string(key)?
            .ok_or_else(|| format!("{key} is missing"))
    }

    /// A whole-number field (0 to 2^64 - 1) that may be missing.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, String> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{key} must be a whole number from 0 to 2^64 - 1")),
        }
    }

    /// A whole-number field, 0 when missing.
    pub fn u64_or_zero(&self, key: &str) -> Result<u64, String> {
        Ok(self.opt_u64(key)?.unwrap_or(0))
    }

    /// A boolean field, `false` when missing.
    pub fn bool_or_false(&self, key: &str) -> Result<bool, String> {
        match self.present(key) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| format!("{key} must be true or false")),
        }
    }

    /// An array field, empty when missing.
    pub fn array(&self, key: &str) -> Result<&'a [Value], String> {
        match self.present(key) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(_) => Err(format!("{key} must be an array")),
        }
    }

    /// An array field (empty when missing), each element read by `read`.
    pub fn list<T>(
        &self,
        key: &str,
        read: fn(&Value) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let items = self.array(key)?;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(read(item)?);
        }
        Ok(out)
    }

    /// Whether the field is there, `null` included.
    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }
}

/// A value that can be written as JSON.
pub trait ToJson {
    /// The value as JSON.
    fn to_json(&self) -> Value;
}

impl ToJson for Value {
    fn to_json(&self) -> Value {
        self.clone()
    }
}

impl ToJson for str {
    fn to_json(&self) -> Value {
        Value::String(self.to_owned())
    }
}

impl ToJson for String {
    fn to_json(&self) -> Value {
        Value::String(self.clone())
    }
}

impl ToJson for bool {
    fn to_json(&self) -> Value {
        Value::Bool(*self)
    }
}

impl ToJson for f64 {
    /// Not finite: `null`, as serde_json writes it.
    fn to_json(&self) -> Value {
        Number::from_f64(*self).map_or(Value::Null, Value::Number)
    }
}

macro_rules! integers {
    ($($t:ty => $wide:ty),*) => {$(
        impl ToJson for $t {
            fn to_json(&self) -> Value {
                Value::Number(Number::from(*self as $wide))
            }
        }
    )*};
}
integers!(u8 => u64, u16 => u64, u32 => u64, u64 => u64, usize => u64);
integers!(i8 => i64, i16 => i64, i32 => i64, i64 => i64, isize => i64);

impl<T: ToJson> ToJson for Option<T> {
    fn to_json(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToJson::to_json)
    }
}

impl<T: ToJson> ToJson for [T] {
    fn to_json(&self) -> Value {
        Value::Array(self.iter().map(ToJson::to_json).collect())
    }
}

impl<T: ToJson> ToJson for Vec<T> {
    fn to_json(&self) -> Value {
        self.as_slice().to_json()
    }
}

impl<T: ToJson + ?Sized> ToJson for &T {
    fn to_json(&self) -> Value {
        (**self).to_json()
    }
}

/// An empty object, for the macro.
#[doc(hidden)]
pub fn object() -> Map {
    Map::new()
}

/// An object of the macro's key/value pairs (taken out of the slice): one call per object
/// rather than an insertion per field in every `json!`.
#[doc(hidden)]
pub fn object_of(pairs: &mut [(&str, Value)]) -> Value {
    let mut m = Map(Vec::with_capacity(pairs.len()));
    for (k, v) in pairs {
        m.insert((*k).to_owned(), std::mem::take(v));
    }
    Value::Object(m)
}

/// Builds a [`Value`](crate::json::Value) from serde_json's macro syntax; see the [module docs](crate::json).
#[macro_export]
macro_rules! json {
    (null) => { $crate::json::Value::Null };
    ([]) => { $crate::json::Value::Array(::std::vec::Vec::new()) };
    ([ $($tt:tt)+ ]) => {
        $crate::json::Value::Array($crate::json!(@array [] $($tt)+))
    };
    ({}) => { $crate::json::Value::Object($crate::json::object()) };
    ({ $($tt:tt)+ }) => {
        $crate::json::object_of(&mut $crate::json!(@pairs [] $($tt)+))
    };

    (@pairs [$($p:expr,)*]) => { [$($p,)*] };
    (@pairs [$($p:expr,)*] $k:literal : null $(, $($rest:tt)*)?) => {
        $crate::json!(@pairs [$($p,)* ($k, $crate::json::Value::Null),] $($($rest)*)?)
    };
    (@pairs [$($p:expr,)*] $k:literal : [ $($v:tt)* ] $(, $($rest:tt)*)?) => {
        $crate::json!(@pairs [$($p,)* ($k, $crate::json!([ $($v)* ])),] $($($rest)*)?)
    };
    (@pairs [$($p:expr,)*] $k:literal : { $($v:tt)* } $(, $($rest:tt)*)?) => {
        $crate::json!(@pairs [$($p,)* ($k, $crate::json!({ $($v)* })),] $($($rest)*)?)
    };
    (@pairs [$($p:expr,)*] $k:literal : format!($($f:tt)*) $(, $($rest:tt)*)?) => {
        $crate::json!(@pairs [$($p,)* ($k, $crate::json!(format!($($f)*))),] $($($rest)*)?)
    };
    (@pairs [$($p:expr,)*] $k:literal : $v:expr $(, $($rest:tt)*)?) => {
        $crate::json!(@pairs [$($p,)* ($k, $crate::json!($v)),] $($($rest)*)?)
    };

    (@array [$($e:expr,)*]) => { ::std::vec![$($e,)*] };
    (@array [$($e:expr,)*] null $(, $($rest:tt)*)?) => {
        $crate::json!(@array [$($e,)* $crate::json::Value::Null,] $($($rest)*)?)
    };
    (@array [$($e:expr,)*] [ $($v:tt)* ] $(, $($rest:tt)*)?) => {
        $crate::json!(@array [$($e,)* $crate::json!([ $($v)* ]),] $($($rest)*)?)
    };
    (@array [$($e:expr,)*] { $($v:tt)* } $(, $($rest:tt)*)?) => {
        $crate::json!(@array [$($e,)* $crate::json!({ $($v)* }),] $($($rest)*)?)
    };
    (@array [$($e:expr,)*] $v:expr $(, $($rest:tt)*)?) => {
        $crate::json!(@array [$($e,)* $crate::json!($v),] $($($rest)*)?)
    };

    // A formatted string is moved in, not copied.
    (format!($($f:tt)*)) => { $crate::json::Value::String(::std::format!($($f)*)) };
    ($other:expr) => { $crate::json::ToJson::to_json(&$other) };
}

/// Transitional: lets a [`Value`] go where serde values go (the toolkit's answers and log
/// lines take `impl Serialize`).
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let value: serde_json::Value =
            serde_json::from_str(&self.to_string()).map_err(serde::ser::Error::custom)?;
        value.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::{from_slice, to_pretty, Value, MAX_DEPTH, MAX_KEYS};
    use serde_json::json as serde_json;

    /// Ours, read back by serde_json.
    fn theirs(v: &Value) -> serde_json::Value {
        serde_json::from_str(&v.to_string()).unwrap()
    }

    #[test]
    fn builds_what_serde_json_builds() {
        let name = String::from("d/1");
        let missing: Option<&str> = None;
        let ours = crate::json!({
            "a": 1,
            "b": -2i64,
            "c": 31.5,
            "d": f64::NAN,
            "e": name,
            "f": "text",
            "g": missing,
            "h": Some(7u64),
            "i": [1, "two", null, [true], {"k": false}],
            "j": {},
            "k": [],
            "l": null,
            "m": { "n": { "o": format!("{}-{}", 1, 2) } },
            "p": vec![1u16, 2],
            "q": crate::json!({"r": 1}),
        });
        let expected = serde_json!({
            "a": 1,
            "b": -2i64,
            "c": 31.5,
            "d": f64::NAN,
            "e": name,
            "f": "text",
            "g": missing,
            "h": Some(7u64),
            "i": [1, "two", null, [true], {"k": false}],
            "j": {},
            "k": [],
            "l": null,
            "m": { "n": { "o": format!("{}-{}", 1, 2) } },
            "p": vec![1u16, 2],
            "q": serde_json!({"r": 1}),
        });
        assert_eq!(theirs(&ours), expected);
        assert_eq!(theirs(&crate::json!(null)), serde_json!(null));
        assert_eq!(theirs(&crate::json!("s")), serde_json!("s"));
        assert_eq!(theirs(&crate::json!([])), serde_json!([]));
        assert_eq!(crate::json!({"only": 1})["only"], 1u64);
        assert_eq!(crate::json!(format!("{}-{}", 5, "x")), "5-x");
    }

    #[test]
    fn text_that_reorders_or_breaks_lines_is_escaped() {
        let v = crate::json!("a\u{202e}b\u{2028}c\u{7f}d\u{85}e\u{feff}f caf\u{e9}");
        assert_eq!(
            v.to_string(),
            "\"a\\u202eb\\u2028c\\u007fd\\u0085e\\ufefff caf\u{e9}\""
        );
    }

    /// Every format character is escaped, those above U+FFFF as a UTF-16 surrogate pair
    /// (JSON's `\u` takes four hex digits), and read back as the same text.
    #[test]
    fn format_characters_outside_the_first_block_are_escaped() {
        let text = "a\u{890}b\u{8e2}c\u{e0001}d\u{1d173}e\u{13430}f\u{110bd}g\u{1f642}";
        let v = crate::json!(text);
        assert_eq!(
            v.to_string(),
            "\"a\\u0890b\\u08e2c\\udb40\\udc01d\\ud834\\udd73e\\ud80d\\udc30f\\ud804\\udcbdg\u{1f642}\""
        );
        assert_eq!(theirs(&v), serde_json!(text));
    }

    #[test]
    fn reads_what_serde_json_reads() {
        let texts = [
            "null",
            " true ",
            "false",
            "0",
            "-0",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "31.5",
            "-12.25",
            "1e3",
            "1E-3",
            "2.5e+2",
            "0.1",
            "123456789012345.6",
            r#""plain""#,
            r#""esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00 \u0000""#,
            "\"caf\u{e9} \u{1f600}\"",
            "[]",
            "{}",
            r#"[1, [2, {"a": [3]}], "x"]"#,
            r#"{"deviceId": "d/1", "temperature": 40, "nested": {"k": [true, null]}}"#,
            r#"{"a": 1, "a": 2}"#,
            "\n\t [ 1 ,\r\n 2 ] \n",
        ];
        for text in texts {
            let ours = from_slice(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
            let expected: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(theirs(&ours), expected, "{text}");
            // And what we write reads back as the same value.
            assert_eq!(
                from_slice(ours.to_string().as_bytes()).unwrap(),
                ours,
                "{text}"
            );
            assert_eq!(
                from_slice(to_pretty(&ours).as_bytes()).unwrap(),
                ours,
                "{text}"
            );
        }
    }

    #[test]
    fn numbers_of_up_to_15_digits_read_exactly() {
        let exact = [
            "31.5",
            "0.1",
            "-273.15",
            "99999.99999",
            "123456789012345",
            "1e22",
            "4.5e-7",
        ];
        for text in exact {
            let ours = from_slice(text.as_bytes()).unwrap().as_f64().unwrap();
            assert_eq!(ours, text.parse::<f64>().unwrap(), "{text}");
        }
        // Longer: within a few ulps.
        let approximate = [
            "3.14159265358979323846",
            "1.2345678901234567e-100",
            "6.02214076e23",
            "1.7e308",
            "2.5e-300",
            "123456789.123456789e200",
        ];
        for text in approximate {
            let ours = from_slice(text.as_bytes()).unwrap().as_f64().unwrap();
            let exact = text.parse::<f64>().unwrap();
            assert!(
                ((ours - exact) / exact).abs() < 1e-14,
                "{text}: {ours} vs {exact}"
            );
        }
        let tiny = from_slice(b"1e-400").unwrap().as_f64().unwrap();
        assert_eq!(tiny, 0.0);
    }

    #[test]
    fn refuses_what_serde_json_refuses() {
        let texts = [
            "",
            " ",
            "nul",
            "tru",
            "[",
            "[1,",
            "[1 2]",
            "[1,]",
            "{",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            "{1: 2}",
            r#"{"a" 1}"#,
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "NaN",
            "Infinity",
            "1e400",
            "-1e400",
            r#""open"#,
            r#""bad \x""#,
            r#""\u12""#,
            r#""\ud800""#,
            r#""\ud800\u0041""#,
            "\"tab\there\"",
            "[1] x",
            "{} {}",
            "'a'",
        ];
        for text in texts {
            assert!(from_slice(text.as_bytes()).is_err(), "{text:?} was read");
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_err(),
                "{text:?}"
            );
        }
        assert!(from_slice(b"\"\xff\"").is_err());
    }

    #[test]
    fn errors_say_where() {
        let e = from_slice(b"{\n  \"a\": 1,\n  \"b\" 2\n}").unwrap_err();
        assert_eq!(e.to_string(), "expected `:` at line 3 column 7");
        let e = from_slice(b"[1, 2").unwrap_err();
        assert_eq!(e.to_string(), "expected `,` or `]` at line 1 column 6");
    }

    #[test]
    fn many_keys_cannot_make_reading_quadratic() {
        // 1 MiB of distinct keys would be ~10^10 key comparisons with a duplicate check per
        // key: refused at the limit instead, quickly.
        let keys: Vec<String> = (0..95_000).map(|i| format!("\"k{i:05}\":0")).collect();
        let body = format!("{{{}}}", keys.join(","));
        let started = std::time::Instant::now();
        let e = from_slice(body.as_bytes()).unwrap_err();
        assert!(e.to_string().starts_with("an object has more than"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let at_limit: Vec<String> = (0..MAX_KEYS).map(|i| format!("\"k{i}\":{i}")).collect();
        let v = from_slice(format!("{{{}}}", at_limit.join(",")).as_bytes()).unwrap();
        assert_eq!(v.as_object().unwrap().len(), MAX_KEYS);
    }

    #[test]
    fn long_digit_runs_scale_by_their_exponent() {
        let one = format!("1{}e-200000", "0".repeat(200_000));
        assert_eq!(from_slice(one.as_bytes()).unwrap().as_f64(), Some(1.0));
        let tenth = format!("0.{}1e200000", "0".repeat(199_999));
        assert_eq!(from_slice(tenth.as_bytes()).unwrap().as_f64(), Some(1.0));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(from_slice(ok.as_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(from_slice(deep.as_bytes()).is_err());
        let hostile = "[{\"a\":".repeat(100_000);
        assert!(from_slice(hostile.as_bytes()).is_err());
    }

    #[test]
    fn writes_as_serde_json_writes() {
        let text = r#"{"s":"a\"b\\c\n\u0001é","n":[0,-5,1.5,1e-7,100.0],"o":{},"a":[]}"#;
        let ours = from_slice(text.as_bytes()).unwrap();
        let expected: serde_json::Value = serde_json::from_str(text).unwrap();
        // serde_json sorts keys; compare key by key and the shapes of the pretty form.
        for key in ["s", "n", "o", "a"] {
            assert_eq!(ours[key].to_string(), expected[key].to_string(), "{key}");
            assert_eq!(
                to_pretty(&ours[key]),
                serde_json::to_string_pretty(&expected[key]).unwrap(),
                "{key}"
            );
        }
        let ordered = crate::json!({"a": [1, {"b": null}], "c": {}});
        let pretty = "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {}\n}";
        assert_eq!(to_pretty(&ordered), pretty);
        assert_eq!(
            serde_json::to_string_pretty(&theirs(&ordered)).unwrap(),
            pretty
        );
    }

    #[test]
    fn objects_keep_insertion_order_and_compare_as_sets() {
        let mut v = crate::json!({"b": 1, "a": 2});
        v["c"] = crate::json!(3);
        v["b"] = crate::json!(4);
        assert_eq!(v.to_string(), r#"{"b":4,"a":2,"c":3}"#);
        assert_eq!(v, from_slice(br#"{"c":3,"a":2,"b":4}"#).unwrap());
        assert_ne!(v, from_slice(br#"{"c":3,"a":2}"#).unwrap());
        let mut not_object = crate::json!(5);
        not_object["k"] = crate::json!(true);
        assert_eq!(not_object.to_string(), r#"{"k":true}"#);
        assert_eq!(v["missing"], Value::Null);
        assert_eq!(v.pointer("/b"), Some(&crate::json!(4)));
        let nested = from_slice(br#"{"Data":{"timer":{"a/b":[10,11],"~1":1}}}"#).unwrap();
        assert_eq!(nested.pointer("/Data/timer/~01"), Some(&crate::json!(1)));
        assert_eq!(
            nested.pointer("/Data/timer/a~1b/1"),
            Some(&crate::json!(11))
        );
        assert_eq!(nested.pointer("/Data/none"), None);
        assert_eq!(nested.at(&["Data", "timer", "~1"]), Some(&crate::json!(1)));
        assert_eq!(nested.at(&["Data", "none"]), None);
        assert_eq!(nested.at(&[]), Some(&nested));
    }
}
