//! The text the kubelet hashes: go-spew's `%#v` of the checkpoint struct (types on struct
//! fields, none on map keys, map values or slice elements; `<*>` for a pointer reached without
//! its type; `<nil>` for nil maps, slices and pointers; map keys sorted), produced from the JSON
//! as `encoding/json` fills a freshly made checkpoint.
//!
//! One go-spew quirk matters: a nil pointer printed as a map value leaves its "omit the next
//! type" flag set, so when it is the map's last value the struct field after the map is printed
//! without its type (`Cells:[]`, not `Cells:([]int)[]`). [`Writer`] carries that flag.

use serde_json::{Map, Value};

/// The struct's type name as the kubelet prints it.
pub const TYPE: &str = "MemoryManagerCheckpoint";
/// The name a kubelet writing the legacy format under its own type gives it.
pub const TYPE_V1: &str = "MemoryManagerCheckpointV1";

/// Which struct the file is read into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// With `podEntries` (pod-level resource managers).
    Current,
    /// Before pod entries existed.
    Legacy,
}

/// FNV-1a 32 of the text.
pub fn checksum(
    object: &Map<String, Value>,
    format: Format,
    type_name: &str,
) -> Result<u32, String> {
    let text = text(object, format, type_name)?;
    Ok(text.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    }))
}

/// The text and go-spew's "omit the next type" flag.
struct Writer {
    out: String,
    omit_type: bool,
}

impl Writer {
    fn push(&mut self, text: &str) {
        self.out.push_str(text);
    }

    /// A struct field's name and type (unless a nil pointer before left the type omitted).
    fn field(&mut self, separator: &str, name: &str, ty: &str) {
        self.out.push_str(separator);
        self.out.push_str(name);
        self.out.push(':');
        if self.omit_type {
            self.omit_type = false;
        } else {
            self.out.push('(');
            self.out.push_str(ty);
            self.out.push(')');
        }
    }

    /// A map key (formatting it clears the flag).
    fn key(&mut self, first: bool, key: &str) {
        if !first {
            self.out.push(' ');
        }
        self.out.push_str(key);
        self.out.push(':');
        self.omit_type = false;
    }

    /// A nil pointer as a map value.
    fn nil_pointer(&mut self) {
        self.out.push_str("<nil>");
        self.omit_type = true;
    }
}

type Each<'a> = &'a dyn Fn(&Value, &mut Writer) -> Result<(), String>;

/// The whole text, the checksum field zeroed.
pub fn text(
    object: &Map<String, Value>,
    format: Format,
    type_name: &str,
) -> Result<String, String> {
    let policy = match object.get("policyName") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(format!("policyName {other} is not a string")),
    };
    let mut w = Writer {
        out: format!("(*state.{type_name}){{"),
        omit_type: false,
    };
    w.field("", "PolicyName", "string");
    w.push(policy);
    // Maps the kubelet makes before decoding: absent stays empty, null makes nil.
    let made = |key: &str, w: &mut Writer, each: Each<'_>| match object.get(key) {
        None => {
            w.push("map[]");
            Ok(())
        }
        Some(v) => each(v, w),
    };
    w.field(" ", "MachineState", "state.NUMANodeMap");
    made("machineState", &mut w, &|v, w| {
        int_map(v, w, "machineState", &node)
    })?;
    w.field(" ", "Entries", "state.ContainerMemoryAssignments");
    made("entries", &mut w, &|v, w| {
        string_map(v, w, "entries", &|v, w| {
            string_map(v, w, "entries", &blocks)
        })
    })?;
    if format == Format::Current {
        w.field(" ", "PodEntries", "state.PodMemoryAssignments");
        made("podEntries", &mut w, &|v, w| {
            string_map(v, w, "podEntries", &pod_entry)
        })?;
    }
    w.field(" ", "Checksum", "checksum.Checksum");
    w.push("0}");
    Ok(w.out)
}

fn object<'v>(v: &'v Value, what: &str) -> Result<Option<&'v Map<String, Value>>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Object(m) => Ok(Some(m)),
        other => Err(format!("{what}: {other} is not an object")),
    }
}

/// A map keyed by NUMA node id, keys in numeric order.
fn int_map(v: &Value, w: &mut Writer, what: &str, each: Each<'_>) -> Result<(), String> {
    let Some(m) = object(v, what)? else {
        w.push("<nil>");
        return Ok(());
    };
    let mut keys = Vec::with_capacity(m.len());
    for (k, value) in m {
        let id: i64 = k
            .parse()
            .map_err(|_| format!("{what}: key {k:?} is not a NUMA node id"))?;
        keys.push((id, value));
    }
    keys.sort_by_key(|(id, _)| *id);
    w.push("map[");
    for (i, (id, value)) in keys.into_iter().enumerate() {
        w.key(i == 0, &id.to_string());
        each(value, w)?;
    }
    w.push("]");
    Ok(())
}

/// A map keyed by string, keys in byte order.
fn string_map(v: &Value, w: &mut Writer, what: &str, each: Each<'_>) -> Result<(), String> {
    let Some(m) = object(v, what)? else {
        w.push("<nil>");
        return Ok(());
    };
    let mut keys: Vec<(&String, &Value)> = m.iter().collect();
    keys.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    w.push("map[");
    for (i, (k, value)) in keys.into_iter().enumerate() {
        w.key(i == 0, k);
        each(value, w)?;
    }
    w.push("]");
    Ok(())
}

fn field<'v>(m: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn unsigned(m: &Map<String, Value>, key: &str) -> Result<u64, String> {
    field(m, key).map_or(Ok(0), |v| {
        v.as_u64()
            .ok_or_else(|| format!("{key}: {v} is not an unsigned integer"))
    })
}

fn string<'v>(m: &'v Map<String, Value>, key: &str) -> Result<&'v str, String> {
    field(m, key).map_or(Ok(""), |v| {
        v.as_str()
            .ok_or_else(|| format!("{key}: {v} is not a string"))
    })
}

/// `[]int`: nil when absent or null.
fn ints(v: Option<&Value>, w: &mut Writer, what: &str) -> Result<(), String> {
    match v {
        None | Some(Value::Null) => w.push("<nil>"),
        Some(Value::Array(items)) => {
            let mut parts = Vec::with_capacity(items.len());
            for item in items {
                let n = item
                    .as_i64()
                    .ok_or_else(|| format!("{what}: {item} is not an integer"))?;
                parts.push(n.to_string());
            }
            w.push("[");
            w.push(&parts.join(" "));
            w.push("]");
        }
        Some(other) => return Err(format!("{what}: {other} is not a list")),
    }
    Ok(())
}

/// `*NUMANodeState` as a map value.
fn node(v: &Value, w: &mut Writer) -> Result<(), String> {
    let Some(m) = object(v, "machineState node")? else {
        w.nil_pointer();
        return Ok(());
    };
    let assignments = field(m, "numberOfAssignments").map_or(Ok(0), |v| {
        v.as_i64()
            .ok_or_else(|| format!("numberOfAssignments: {v} is not an integer"))
    })?;
    w.push("<*>{");
    w.field("", "NumberOfAssignments", "int");
    w.push(&assignments.to_string());
    w.field(" ", "MemoryMap", "map[v1.ResourceName]*state.MemoryTable");
    match field(m, "memoryMap") {
        None => w.push("<nil>"),
        Some(v) => string_map(v, w, "memoryMap", &table)?,
    }
    w.field(" ", "Cells", "[]int");
    ints(m.get("cells"), w, "cells")?;
    w.push("}");
    Ok(())
}

/// `*MemoryTable` as a map value.
fn table(v: &Value, w: &mut Writer) -> Result<(), String> {
    let Some(m) = object(v, "memoryMap table")? else {
        w.nil_pointer();
        return Ok(());
    };
    w.push("<*>{");
    for (i, (name, key)) in [
        ("TotalMemSize", "total"),
        ("SystemReserved", "systemReserved"),
        ("Allocatable", "allocatable"),
        ("Reserved", "reserved"),
        ("Free", "free"),
    ]
    .into_iter()
    .enumerate()
    {
        w.field(if i == 0 { "" } else { " " }, name, "uint64");
        w.push(&unsigned(m, key)?.to_string());
    }
    w.push("}");
    Ok(())
}

/// `[]Block`.
fn blocks(v: &Value, w: &mut Writer) -> Result<(), String> {
    let items = match v {
        Value::Null => {
            w.push("<nil>");
            return Ok(());
        }
        Value::Array(items) => items,
        other => return Err(format!("blocks: {other} is not a list")),
    };
    w.push("[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            w.push(" ");
        }
        // A null element decodes to a zero Block.
        let empty = Map::new();
        let m = object(item, "block")?.unwrap_or(&empty);
        w.push("{");
        w.field("", "NUMAAffinity", "[]int");
        ints(m.get("numaAffinity"), w, "numaAffinity")?;
        w.field(" ", "Type", "v1.ResourceName");
        w.push(string(m, "type")?);
        w.field(" ", "Size", "uint64");
        w.push(&unsigned(m, "size")?.to_string());
        w.push("}");
    }
    w.push("]");
    Ok(())
}

/// `PodEntry` (a struct, not a pointer) as a map value.
fn pod_entry(v: &Value, w: &mut Writer) -> Result<(), String> {
    let empty = Map::new();
    let m = object(v, "podEntries entry")?.unwrap_or(&empty);
    w.push("{");
    w.field("", "MemoryBlocks", "[]state.Block");
    match field(m, "memoryBlocks") {
        None => w.push("<nil>"),
        Some(v) => blocks(v, w)?,
    }
    w.push("}");
    Ok(())
}
