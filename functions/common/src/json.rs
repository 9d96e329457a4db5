//! Building JSON answers and log lines without serde's serializer.
//!
//! [`json!`](crate::json!) takes the same syntax as `serde_json::json!` (objects with literal
//! keys, arrays, `null`, and any expression as a leaf) and builds the same `serde_json::Value`,
//! but converts each leaf with [`ToJson`], a plain conversion, where serde_json's macro runs
//! `to_value(&leaf).unwrap()`: one serializer instance and one panic site per leaf type and
//! call. In the components that difference is several KB each.

use serde_json::{Map, Number, Value};

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
    ($($t:ty),*) => {$(
        impl ToJson for $t {
            fn to_json(&self) -> Value {
                Value::Number(Number::from(*self))
            }
        }
    )*};
}
integers!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

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

/// Types written through their `Serialize` derive (stored records: the same JSON as the blobs
/// they are kept in).
macro_rules! serialized {
    ($($t:ty),*) => {$(
        impl ToJson for $t {
            fn to_json(&self) -> Value {
                serde_json::to_value(self).unwrap_or(Value::Null)
            }
        }
    )*};
}
serialized!(crate::jobs::Entry, crate::ttl::State, crate::ttl::Report);

/// An empty object, for the macro.
#[doc(hidden)]
pub fn object() -> Map<String, Value> {
    Map::new()
}

/// Builds a `serde_json::Value` from JSON syntax; see the [module docs](crate::json).
#[macro_export]
macro_rules! json {
    (null) => { $crate::__json::Value::Null };
    ([]) => { $crate::__json::Value::Array(::std::vec::Vec::new()) };
    ([ $($tt:tt)+ ]) => {
        $crate::__json::Value::Array($crate::json!(@array [] $($tt)+))
    };
    ({}) => { $crate::__json::Value::Object($crate::json::object()) };
    ({ $($tt:tt)+ }) => {{
        let mut object = $crate::json::object();
        $crate::json!(@object object $($tt)+);
        $crate::__json::Value::Object(object)
    }};

    (@object $o:ident) => {};
    (@object $o:ident $k:literal : null $(, $($rest:tt)*)?) => {
        $o.insert(::std::string::String::from($k), $crate::__json::Value::Null);
        $crate::json!(@object $o $($($rest)*)?);
    };
    (@object $o:ident $k:literal : [ $($v:tt)* ] $(, $($rest:tt)*)?) => {
        $o.insert(::std::string::String::from($k), $crate::json!([ $($v)* ]));
        $crate::json!(@object $o $($($rest)*)?);
    };
    (@object $o:ident $k:literal : { $($v:tt)* } $(, $($rest:tt)*)?) => {
        $o.insert(::std::string::String::from($k), $crate::json!({ $($v)* }));
        $crate::json!(@object $o $($($rest)*)?);
    };
    (@object $o:ident $k:literal : $v:expr $(, $($rest:tt)*)?) => {
        $o.insert(::std::string::String::from($k), $crate::json!($v));
        $crate::json!(@object $o $($($rest)*)?);
    };

    (@array [$($e:expr,)*]) => { ::std::vec![$($e,)*] };
    (@array [$($e:expr,)*] null $(, $($rest:tt)*)?) => {
        $crate::json!(@array [$($e,)* $crate::__json::Value::Null,] $($($rest)*)?)
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

    ($other:expr) => { $crate::json::ToJson::to_json(&$other) };
}

#[cfg(test)]
mod tests {
    use serde_json::json as serde_json;

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
            "q": serde_json!({"r": 1}),
        });
        let theirs = serde_json!({
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
        assert_eq!(ours, theirs);
        assert_eq!(crate::json!(null), serde_json!(null));
        assert_eq!(crate::json!("s"), serde_json!("s"));
        assert_eq!(crate::json!([]), serde_json!([]));
        assert_eq!(crate::json!({"only": 1}), serde_json!({"only": 1}));
    }
}
