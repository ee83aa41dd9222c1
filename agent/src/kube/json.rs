//! How a request body's JSON maps onto the request types, where serde's defaults differ from
//! Kubernetes and from the OpenAPI document: used as `#[serde(deserialize_with = …)]`.
//!
//! * **`null` is a field left out** ([`or_default`], [`object_or_default`],
//!   [`objects_or_default`]), as Kubernetes' JSON decoding reads it (`"resources": null`,
//!   `"initContainers": null`); `Option` fields read it so already.
//! * **A struct is a JSON object, never an array** ([`Object`], [`object`] and the rest): serde's
//!   derive also reads a struct from an array of its field values in order, so `"spec": [null]`
//!   was a pod without containers.
//! * **A whole number is a whole number** ([`whole_number`]) however JSON writes it: `669.0` is
//!   `669`, as the document's `integer` says.
//! * **A list is bounded while it is read** ([`AtMost`]): the lists of structs here stop at
//!   [`MAX_OBJECTS`] entries, an error naming the bound, before the next is read. A list of empty
//!   objects takes about fifty times its text in memory (1 MiB of `{},` is 300,000 containers),
//!   so a count checked after reading would come after the memory was taken (#38).

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer,
    de::{self, MapAccess, SeqAccess, Unexpected, Visitor, value::MapAccessDeserializer},
};

/// The most entries a list of structs may have ([`objects`], [`objects_or_default`]): above
/// `--max-containers`' largest value, which the request checks afterwards with its own message.
pub const MAX_OBJECTS: usize = 10_000;

/// A list of at most `N` entries: one more is an error saying so, before it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtMost<T, const N: usize>(pub Vec<T>);

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for AtMost<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AtMost<T, N>, D::Error> {
        struct List<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for List<T, N> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {N} entries")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(N));
                while let Some(item) = seq.next_element()? {
                    if list.len() == N {
                        return Err(de::Error::custom(format_args!(
                            "more than {N} entries in a list"
                        )));
                    }
                    list.push(item);
                }
                Ok(list)
            }
        }
        d.deserialize_seq(List::<T, N>(PhantomData)).map(AtMost)
    }
}

/// A field's value, with `null` read as the field left out (its default).
pub fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// `T` (a struct) read from a JSON object only.
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Object<T>, D::Error> {
        struct Fields<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(PhantomData)).map(Object)
    }
}

/// A struct field: an object.
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Object::deserialize(d).map(|o| o.0)
}

/// An optional struct field: an object, or `null` (`None`).
pub fn optional_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Object<T>>::deserialize(d).map(|o| o.map(|o| o.0))
}

/// A struct field with a default: an object, or `null` (the default).
pub fn object_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    optional_object(d).map(Option::unwrap_or_default)
}

/// A list of structs: an array of at most [`MAX_OBJECTS`] objects, or `null` (empty).
pub fn objects_or_default<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let list = Option::<AtMost<Object<T>, MAX_OBJECTS>>::deserialize(d)?;
    Ok(list.map_or_else(Vec::new, |l| l.0.into_iter().map(|o| o.0).collect()))
}

/// A required list of structs: an array of at most [`MAX_OBJECTS`] objects.
pub fn objects<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let list = AtMost::<Object<T>, MAX_OBJECTS>::deserialize(d)?;
    Ok(list.0.into_iter().map(|o| o.0).collect())
}

/// A field's text when it is a JSON string, `None` for any other value (skipped as it is read,
/// never kept): a field read only when it is text, as a JSON pointer and `as_str` would.
pub fn text_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Text;
    impl<'de> Visitor<'de> for Text {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any value")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Option<String>, E> {
            Ok(Some(s.to_owned()))
        }
        fn visit_string<E: de::Error>(self, s: String) -> Result<Option<String>, E> {
            Ok(Some(s))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<String>, A::Error> {
            while seq.next_element::<de::IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            while map
                .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                .is_some()
            {}
            Ok(None)
        }
    }
    d.deserialize_any(Text)
}

/// A whole number from any JSON number that is one, `4194304.0` and `4.194304e6` included (JSON,
/// and the OpenAPI document's `integer`, make no difference between them); fractions, negative
/// numbers and numbers of 2^64 or more are refused.
pub fn whole_number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct Whole;
    impl Visitor<'_> for Whole {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a whole number from 0 to 2^64-1")
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
        }
        fn visit_f64<E: de::Error>(self, n: f64) -> Result<u64, E> {
            // 2^64 as f64 is exact; every whole f64 below it converts exactly.
            if n.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&n) {
                Ok(n as u64)
            } else {
                Err(E::invalid_value(Unexpected::Float(n), &self))
            }
        }
    }
    d.deserialize_any(Whole)
}

#[cfg(test)]
mod tests;
