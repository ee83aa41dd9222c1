//! The kubelet's Memory Manager checkpoint (`/var/lib/kubelet/memory_manager_state`), read and
//! verified exactly as the kubelet does, and written as the kubelet writes it.
//!
//! The kubelet's checksum is FNV-1a (32 bits) of go-spew's `%#v` text of the checkpoint struct
//! with its checksum zeroed (`k8s.io/utils/dump.ForHash`: sorted map keys, no pointer
//! addresses). [`spew`] produces that text from the JSON as Go's decoder would fill the struct:
//! absent maps stay the empty maps the kubelet starts with, `null` makes them nil, and nil and
//! empty print differently. Three versions exist, read in the kubelet's order:
//! * V3 (the newest kubelets): the state as a JSON string `data` with its own `dataChecksum`
//!   (the hash of `(string)<data>`), beside the V1 fields inline for older kubelets. A file with
//!   V3 data that does not verify is refused, not read as an older version.
//! * V2: with `podEntries` (pod-level resource managers), the struct named
//!   `MemoryManagerCheckpoint` in the hash.
//! * V1: no pod entries, hashed under `MemoryManagerCheckpoint` or `MemoryManagerCheckpointV1`;
//!   a zero checksum is accepted (the kubelet's compatibility rule).
//!
//! A file is used whole or refused with what to do; never half-read. [`to_kubelet_json`] writes
//! V3 as the newest kubelet does.

mod spew;

use std::path::Path;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::state::{
    ContainerAssignments, MachineState, MemoryManagerState, NumaNodeState, PodAssignments,
};

pub use spew::Format;

/// The checkpoint version a file was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
    V3,
}

/// What the kubelet says to do with a checkpoint it cannot restore.
const KUBELET_ADVICE: &str = "the kubelet refuses such a file too: drain this node and delete the file before restarting the kubelet";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: not JSON: {detail}")]
    Json { path: String, detail: String },
    #[error(
        "{path}: not a kubelet Memory Manager checkpoint (no machineState; is it another manager's state file?)"
    )]
    Foreign { path: String },
    #[error("{path}: {detail} (the kubelet could not read it either; {KUBELET_ADVICE})")]
    Shape { path: String, detail: String },
    #[error(
        "{path}: checksum {stored} does not match the content ({computed}): the file is corrupt or was edited; {KUBELET_ADVICE}"
    )]
    Mismatch {
        path: String,
        stored: u64,
        computed: u32,
    },
    #[error(
        "{path}: the Memory Manager policy is {policy:?}: only the static policy makes NUMA assignments to read"
    )]
    Policy { path: String, policy: String },
}

/// Whether a file without a `checksum` field is accepted unverified (a hand-written state for
/// `hints --state`) or must pass the kubelet's own rules (a live checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    Kubelet,
    UnlessAbsent,
}

/// A checkpoint read: its state, version, and whether its checksum was verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub state: MemoryManagerState,
    pub version: Version,
    pub verified: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    policy_name: Option<String>,
    #[serde(default)]
    machine_state: Option<MachineState>,
    #[serde(default)]
    entries: Option<ContainerAssignments>,
    #[serde(default)]
    pod_entries: Option<PodAssignments>,
}

/// Reads a checkpoint (see the module documentation).
pub fn read(
    path: &Path,
    bytes: &[u8],
    verification: Verification,
) -> Result<Checkpoint, CheckpointError> {
    let name = path.display().to_string();
    let value: Value = serde_json::from_slice(bytes).map_err(|e| CheckpointError::Json {
        path: name.clone(),
        detail: e.to_string(),
    })?;
    let Some(object) = value.as_object() else {
        return Err(CheckpointError::Foreign { path: name });
    };
    if !object.contains_key("machineState") {
        return Err(CheckpointError::Foreign { path: name });
    }
    let shape = |detail: String| CheckpointError::Shape {
        path: name.clone(),
        detail,
    };
    if let Some((data, stored)) = v3_payload(object).map_err(&shape)? {
        let computed = fnv32a(&format!("(string){data}"));
        if stored != u64::from(computed) {
            return Err(CheckpointError::Mismatch {
                path: name,
                stored,
                computed,
            });
        }
        let inner: Value = serde_json::from_str(data)
            .map_err(|e| shape(format!("data is not the JSON of a checkpoint: {e}")))?;
        return typed(&name, inner, Version::V3, true);
    }
    let (version, verified) = verify(object, verification).map_err(|e| match e {
        Verify::Shape(detail) => shape(detail),
        Verify::Mismatch { stored, computed } => CheckpointError::Mismatch {
            path: name.clone(),
            stored,
            computed,
        },
    })?;
    typed(&name, value, version, verified)
}

/// The state of a verified checkpoint's JSON.
fn typed(
    name: &str,
    mut value: Value,
    version: Version,
    verified: bool,
) -> Result<Checkpoint, CheckpointError> {
    normalize(&mut value);
    let raw: Raw =
        serde_path_to_error::deserialize(&value).map_err(|e| CheckpointError::Shape {
            path: name.to_string(),
            detail: format!("at {}: {}", e.path(), e.inner()),
        })?;
    let policy_name = raw.policy_name.unwrap_or_default();
    if policy_name.is_empty() || policy_name.eq_ignore_ascii_case("none") {
        return Err(CheckpointError::Policy {
            path: name.to_string(),
            policy: policy_name,
        });
    }
    Ok(Checkpoint {
        state: MemoryManagerState {
            policy_name,
            machine_state: raw.machine_state.unwrap_or_default(),
            entries: raw.entries.unwrap_or_default(),
            pod_entries: match version {
                Version::V1 => PodAssignments::new(),
                Version::V2 | Version::V3 => raw.pod_entries.unwrap_or_default(),
            },
        },
        version,
        verified,
    })
}

/// V3's `data` and `dataChecksum`, when the file carries either (the kubelet then reads it as V3
/// or not at all).
fn v3_payload(object: &Map<String, Value>) -> Result<Option<(&str, u64)>, String> {
    let data = match object.get("data") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(format!("data {other} is not a string")),
    };
    let stored = match object.get("dataChecksum") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("dataChecksum {v} is not an unsigned integer"))?,
    };
    Ok((!data.is_empty() || stored != 0).then_some((data, stored)))
}

fn fnv32a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// [`read`], the state only.
pub fn parse(
    path: &Path,
    bytes: &[u8],
    verification: Verification,
) -> Result<MemoryManagerState, CheckpointError> {
    read(path, bytes, verification).map(|c| c.state)
}

/// What Go's decoder makes of `null`, in the typed state: a nil slice or map is empty, a zero
/// field is 0, a null element of a block list is a zero block; a nil node or memory table (which
/// the kubelet itself would dereference and crash on) is left out.
fn normalize(value: &mut Value) {
    fn each_value(v: &mut Value, f: impl Fn(&mut Value)) {
        if let Value::Object(m) = v {
            m.values_mut().for_each(f);
        }
    }
    fn drop_nulls(v: &mut Value) {
        if let Value::Object(m) = v {
            m.retain(|_, item| !item.is_null());
        }
    }
    fn or_empty(v: &mut Value, empty: Value) {
        if v.is_null() {
            *v = empty;
        }
    }
    fn fields(v: &mut Value, zero: &[(&str, Value)]) {
        if let Value::Object(m) = v {
            for (key, zero) in zero {
                if m.get(*key).is_none_or(Value::is_null) {
                    m.insert((*key).to_string(), zero.clone());
                }
            }
        }
    }
    fn blocks(v: &mut Value) {
        or_empty(v, Value::Array(Vec::new()));
        if let Value::Array(items) = v {
            for block in items {
                or_empty(block, Value::Object(Map::new()));
                let zero = [
                    ("numaAffinity", Value::Array(Vec::new())),
                    ("type", Value::String(String::new())),
                    ("size", Value::from(0)),
                ];
                fields(block, &zero);
            }
        }
    }
    let Value::Object(top) = value else {
        return;
    };
    for key in ["machineState", "entries", "podEntries"] {
        if let Some(v) = top.get_mut(key) {
            or_empty(v, Value::Object(Map::new()));
        }
    }
    if let Some(machine) = top.get_mut("machineState") {
        drop_nulls(machine);
        each_value(machine, |node| {
            let zero = [
                ("numberOfAssignments", Value::from(0)),
                ("memoryMap", Value::Object(Map::new())),
                ("cells", Value::Array(Vec::new())),
            ];
            fields(node, &zero);
            if let Value::Object(n) = node
                && let Some(tables) = n.get_mut("memoryMap")
            {
                drop_nulls(tables);
                each_value(tables, |table| {
                    let zero = ["total", "systemReserved", "allocatable", "reserved", "free"]
                        .map(|k| (k, Value::from(0)));
                    fields(table, &zero);
                });
            }
        });
    }
    if let Some(entries) = top.get_mut("entries") {
        each_value(entries, |containers| {
            or_empty(containers, Value::Object(Map::new()));
            each_value(containers, blocks);
        });
    }
    if let Some(pods) = top.get_mut("podEntries") {
        each_value(pods, |entry| {
            or_empty(entry, Value::Object(Map::new()));
            if let Value::Object(e) = entry {
                e.values_mut().for_each(blocks);
            }
        });
    }
}

enum Verify {
    Shape(String),
    Mismatch { stored: u64, computed: u32 },
}

/// The version whose checksum the file's matches (and whether one was checked at all).
fn verify(
    object: &Map<String, Value>,
    verification: Verification,
) -> Result<(Version, bool), Verify> {
    let current_only = object.contains_key("podEntries");
    let stored = match object.get("checksum") {
        None if verification == Verification::UnlessAbsent => {
            let version = if current_only {
                Version::V2
            } else {
                Version::V1
            };
            return Ok((version, false));
        }
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| Verify::Shape(format!("checksum {v} is not an unsigned integer")))?,
    };
    let current = spew::checksum(object, Format::Current, spew::TYPE).map_err(Verify::Shape)?;
    if stored == u64::from(current) {
        return Ok((Version::V2, true));
    }
    // Read as V1, the file's pod entries are not seen (the V1 struct has none).
    for type_name in [spew::TYPE, spew::TYPE_V1] {
        if stored
            == u64::from(spew::checksum(object, Format::Legacy, type_name).map_err(Verify::Shape)?)
        {
            return Ok((Version::V1, true));
        }
    }
    if stored == 0 {
        // "accept empty checksum for compatibility with old file backend"
        return Ok((Version::V1, false));
    }
    Err(Verify::Mismatch {
        stored,
        computed: current,
    })
}

/// The kubelet's checksum of a checkpoint file's content in `format` (its own checksum field
/// ignored).
pub fn kubelet_checksum(path: &Path, bytes: &[u8], format: Format) -> Result<u32, CheckpointError> {
    let name = path.display().to_string();
    let value: Value = serde_json::from_slice(bytes).map_err(|e| CheckpointError::Json {
        path: name.clone(),
        detail: e.to_string(),
    })?;
    let object = value
        .as_object()
        .ok_or(CheckpointError::Foreign { path: name.clone() })?;
    spew::checksum(object, format, spew::TYPE)
        .map_err(|detail| CheckpointError::Shape { path: name, detail })
}

/// The checkpoint as the newest kubelet writes it (V3): the state as a JSON string with its
/// checksum, and the V1 fields inline with theirs. Fields in the kubelet's order and map keys
/// sorted as Go sorts them, so the bytes are the kubelet's.
pub fn to_kubelet_json(state: &MemoryManagerState) -> Vec<u8> {
    let data = Data {
        policy_name: &state.policy_name,
        machine_state: GoKeys(&state.machine_state),
        entries: &state.entries,
        pod_entries: &state.pod_entries,
    };
    // Our own types serialise without fail; the fallbacks are never taken.
    let payload = serde_json::to_string(&data).unwrap_or_default();
    let legacy = serde_json::to_value(Data {
        pod_entries: &PodAssignments::new(),
        ..data
    })
    .ok()
    .and_then(|v| v.as_object().cloned())
    .map_or(0, |object| {
        spew::checksum(&object, Format::Legacy, spew::TYPE).unwrap_or(0)
    });
    let file = File {
        policy_name: &state.policy_name,
        machine_state: GoKeys(&state.machine_state),
        entries: &state.entries,
        checksum: legacy,
        data_checksum: fnv32a(&format!("(string){payload}")),
        data: payload,
    };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// The V3 payload (`MemoryManagerCheckpointData`).
#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
struct Data<'a> {
    policy_name: &'a str,
    machine_state: GoKeys<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    entries: &'a ContainerAssignments,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pod_entries: &'a PodAssignments,
}

/// The V3 file: the V1 fields inline, then the payload and its checksum.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File<'a> {
    policy_name: &'a str,
    machine_state: GoKeys<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    entries: &'a ContainerAssignments,
    checksum: u32,
    data: String,
    data_checksum: u32,
}

/// NUMA node ids as map keys in Go's order (as strings: "10" before "2").
#[derive(Clone, Copy)]
struct GoKeys<'a>(&'a MachineState);

impl Serialize for GoKeys<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut keys: Vec<(String, &NumaNodeState)> =
            self.0.iter().map(|(k, v)| (k.to_string(), v)).collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let mut map = s.serialize_map(Some(keys.len()))?;
        for (k, v) in keys {
            map.serialize_entry(&k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests;
