//! Reading a JSON value of any shape into a type that takes only some shapes. The shapes it
//! does not take are read past, never built, and give the type's [`FromShape::other`] value,
//! so a reader can still say what is wrong with a field instead of failing the whole parse
//! (and no JSON tree is built for what is read).

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::marker::PhantomData;

/// A type read from whichever JSON value comes; each method reads one shape, and by default
/// gives [`FromShape::other`].
pub(crate) trait FromShape: Sized {
    /// What a shape the type does not read gives.
    fn other() -> Self;
    fn from_str(_: &str) -> Self {
        Self::other()
    }
    fn from_bool(_: bool) -> Self {
        Self::other()
    }
    fn from_i64(_: i64) -> Self {
        Self::other()
    }
    fn from_u64(_: u64) -> Self {
        Self::other()
    }
    fn from_f64(_: f64) -> Self {
        Self::other()
    }
    fn from_null() -> Self {
        Self::other()
    }
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::other())
    }
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self::other())
    }
}

/// Reads a `T` from `deserializer`, whatever the value's shape.
pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: FromShape>(
    deserializer: D,
) -> Result<T, D::Error> {
    deserializer.deserialize_any(Shaped(PhantomData))
}

struct Shaped<T>(PhantomData<T>);

impl<'de, T: FromShape> Visitor<'de> for Shaped<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<T, E> {
        Ok(T::from_bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<T, E> {
        Ok(T::from_i64(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<T, E> {
        Ok(T::from_u64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<T, E> {
        Ok(T::from_f64(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<T, E> {
        Ok(T::from_str(v))
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::from_null())
    }
    fn visit_none<E>(self) -> Result<T, E> {
        Ok(T::from_null())
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        deserializer.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::from_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }
}

/// Implements `Deserialize` for each type through its [`FromShape`].
macro_rules! deserialize_by_shape {
    ($($name:ty),*) => {$(
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::json_shape::deserialize(deserializer)
            }
        }
    )*};
}
pub(crate) use deserialize_by_shape;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    enum Small {
        Text(String),
        Number(u64),
        Other,
    }

    impl FromShape for Small {
        fn other() -> Self {
            Small::Other
        }
        fn from_str(v: &str) -> Self {
            Small::Text(v.to_string())
        }
        fn from_u64(v: u64) -> Self {
            Small::Number(v)
        }
    }

    deserialize_by_shape!(Small);

    #[test]
    fn shapes_not_read_are_read_past() {
        let read: Vec<Small> =
            serde_json::from_str(r#"["a", 7, -1, 2.5, true, null, [1, [2]], {"k": {"v": []}}]"#)
                .unwrap();
        let mut expected = vec![Small::Text("a".into()), Small::Number(7)];
        expected.extend((0..6).map(|_| Small::Other));
        assert_eq!(read, expected);
        assert!(
            serde_json::from_str::<Small>("[1,").is_err(),
            "bad JSON is still an error"
        );
    }
}
