use serde::Deserialize;
use serde_json::json;

use super::*;

#[derive(Debug, Default, PartialEq, Deserialize)]
struct Inner {
    #[serde(default)]
    a: u32,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Outer {
    #[serde(default, deserialize_with = "or_default")]
    name: String,
    #[serde(default, deserialize_with = "object_or_default")]
    inner: Inner,
    #[serde(default, deserialize_with = "optional_object")]
    maybe: Option<Inner>,
    #[serde(default, deserialize_with = "objects_or_default")]
    list: Vec<Inner>,
    #[serde(deserialize_with = "objects")]
    required: Vec<Inner>,
}

fn read(value: serde_json::Value) -> Result<Outer, String> {
    serde_json::from_value::<Object<Outer>>(value)
        .map(|o| o.0)
        .map_err(|e| e.to_string())
}

#[test]
fn null_is_a_field_left_out() {
    let nulls =
        read(json!({"name": null, "inner": null, "maybe": null, "list": null, "required": []}));
    let absent = read(json!({"required": []}));
    assert_eq!(nulls, absent);
    assert_eq!(
        absent,
        Ok(Outer {
            name: String::new(),
            inner: Inner::default(),
            maybe: None,
            list: Vec::new(),
            required: Vec::new(),
        })
    );
    // A required list is not optional: null is refused.
    assert!(read(json!({"required": null})).is_err());
}

#[test]
fn objects_are_read_and_arrays_refused_where_serde_would_take_them_as_structs() {
    let full = read(
        json!({"inner": {"a": 1}, "maybe": {"a": 2}, "list": [{"a": 3}], "required": [{"a": 4}]}),
    )
    .expect("objects");
    assert_eq!((full.inner.a, full.maybe.map(|m| m.a)), (1, Some(2)));
    assert_eq!((full.list[0].a, full.required[0].a), (3, 4));
    // Serde's derive reads a struct from an array of its fields; none of these may pass.
    for bad in [
        json!([null, null, null, null, []]),
        json!({"inner": [1], "required": []}),
        json!({"maybe": [1], "required": []}),
        json!({"list": [[1]], "required": []}),
        json!({"required": [[1]]}),
        json!({"list": [null], "required": []}),
    ] {
        let refused = read(bad.clone()).expect_err("refused");
        assert!(
            refused.contains("expected an object") || refused.contains("invalid type: null"),
            "{bad}: {refused}"
        );
    }
}

#[test]
fn whole_numbers_however_json_writes_them() {
    #[derive(Debug, Deserialize)]
    struct N(#[serde(deserialize_with = "whole_number")] u64);
    let read = |text: &str| serde_json::from_str::<N>(text).map(|n| n.0);
    assert_eq!(read("669").ok(), Some(669));
    assert_eq!(read("669.0").ok(), Some(669));
    assert_eq!(read("4.194304e6").ok(), Some(4_194_304));
    assert_eq!(read("-0.0").ok(), Some(0));
    assert_eq!(read("18446744073709551615").ok(), Some(u64::MAX));
    assert_eq!(
        read("1.8446744073709550e19").ok(),
        Some(18_446_744_073_709_549_568)
    );
    for refused in [
        "0.5",
        "-1",
        "-1.0",
        "18446744073709551616",
        "1.8446744073709552e19",
        "1e400",
        "\"1\"",
    ] {
        assert!(read(refused).is_err(), "{refused}");
    }
}

#[test]
fn a_large_whole_number_written_with_a_fraction_is_read_exactly() {
    // 51 bits: the last bit of the f64 is a quarter; serde_json's fast parsing got it wrong.
    #[derive(Debug, Deserialize)]
    struct N(#[serde(deserialize_with = "whole_number")] u64);
    let read = serde_json::from_str::<N>("2067084125191939.0").map(|n| n.0);
    assert_eq!(read.ok(), Some(2_067_084_125_191_939));
}

/// Bug (#38): a list of empty objects takes some fifty times its text once read; 1 MiB of
/// `{},` was 300,000 containers before any count was checked.
#[test]
fn a_list_of_structs_stops_at_its_bound_before_reading_more() {
    let list = |n: usize| json!({"list": vec![json!({}); n], "required": vec![json!({"a": 1}); n]});
    let at = read(list(MAX_OBJECTS)).expect("at the bound");
    assert_eq!(
        (at.list.len(), at.required.len()),
        (MAX_OBJECTS, MAX_OBJECTS)
    );
    let over = read(list(MAX_OBJECTS + 1)).expect_err("over the bound");
    assert!(
        over.starts_with(&format!("more than {MAX_OBJECTS} entries in a list")),
        "{over}"
    );
    let text_or_none_reads =
        |v: serde_json::Value| text_or_none(v).map_err(|e: serde_json::Error| e.to_string());
    assert_eq!(text_or_none_reads(json!("n")), Ok(Some("n".to_owned())));
    for other in [
        json!(1),
        json!(null),
        json!([1, "x"]),
        json!({"k": "v"}),
        json!(true),
    ] {
        assert_eq!(text_or_none_reads(other), Ok(None));
    }
}
