//! `GET /openapi.json`: the API described as OpenAPI 3.1, every endpoint and every error, and the
//! request bodies exactly as the server reads them: the identifiers' patterns and limits are
//! [`identifiers`]'s, `null` is accepted wherever a field is optional, and `numaNodes` lists this
//! machine's nodes. `tests/openapi_contract.rs` runs schemathesis against a live agent to keep
//! the two in step.

use serde_json::{Value, json};

use crate::{host::NumaNode, kube::identifiers};

/// A Kubernetes qualified name (a resource name), as `pod::resource_use` checks it.
const QUALIFIED_NAME: &str = "^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// A pod's identifier as the API checks it ([`identifiers`]): absent, `null` or empty is not
/// given; anything else matches the rule.
fn identifier(pattern: &str, max: usize, rule: &str) -> Value {
    json!({
        "type": ["string", "null"],
        "maxLength": max,
        "pattern": format!("^$|{pattern}"),
        "description": format!("{rule}; absent, null or empty: not given")
    })
}

/// `qosClass`: one of Kubernetes' three, or not given (computed as Kubernetes does).
fn qos_class() -> Value {
    json!({"enum": ["Guaranteed", "Burstable", "BestEffort", "", null], "description": "absent, null or empty: computed as Kubernetes does"})
}

/// `GET /v1/hugepages`: the snapshot, or with `watch=true` the stream of states.
fn hugepages_path() -> Value {
    json!({"get": {
        "summary": "The hugepage map: per NUMA node and size, and system-wide; or, with watch=true, a stream of its states",
        "description": "With watch=true the answer is a stream (application/x-ndjson), one WatchEvent a line, as Kubernetes watches are: SNAPSHOT (the state now) first, MODIFIED with each new state (a change of free, reserved or unreserved hugepages on a NUMA node, or of the NUMA selection's inputs), BOOKMARK every --watch-heartbeat while nothing changes. Each event names the agent's epoch (new at each start) and the state's generation; a client that resumes with both and is up to date gets no SNAPSHOT, any other gets one. A watch ends after --watch-max-duration (jittered up to twice it); at most --max-watchers at once.",
        "parameters": [
            {"name": "watch", "in": "query", "required": false, "schema": {"type": "boolean"}, "description": "true: a stream of states instead of the snapshot"},
            {"name": "epoch", "in": "query", "required": false, "schema": {"type": "string"}, "description": "with watch: the epoch of the last event seen"},
            {"name": "generation", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0, "maximum": u64::MAX}, "description": "with watch: the generation of the last event seen"}
        ],
        "responses": {
            "200": {"description": "The latest snapshot; with watch=true, the stream", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Snapshot"}},
                "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/WatchEvent"}}
            }},
            "400": problem("watch or generation is not what it should be (the parameter named in field)"),
            "503": problem("--max-watchers watches are open; Retry-After says when to try again")
        }
    }})
}

/// A watch state's `kubeletSelection`.
fn kubelet_selection_schema() -> Value {
    json!({"type": "object", "description": "under numaSelection kubelet, what selects the nodes the kubelet would pick (absent when the agent cannot select either: then ask it)", "properties": {
        "topologyManagerPolicy": {"enum": ["none", "best-effort", "restricted", "single-numa-node"]},
        "topologyManagerScope": {"enum": ["container", "pod"]},
        "preferClosestNumaNodes": {"type": "boolean"},
        "maxAllowableNumaNodes": {"type": "integer"},
        "podLevelResources": {"type": "boolean", "description": "the kubelet's PodLevelResources feature gate"},
        "podLevelResourceManagers": {"type": "boolean", "description": "the kubelet's PodLevelResourceManagers feature gate"},
        "numaDistances": {"type": "object", "description": "NUMA node id -> its distances to the nodes, indexed by node id", "additionalProperties": {"type": "array", "items": {"type": "integer"}}},
        "machineState": {"type": "object", "description": "the Memory Manager's machine state as in its checkpoint (NUMA node id -> numberOfAssignments, memoryMap, cells); its assignments are not sent", "additionalProperties": {"type": "object", "properties": {
            "numberOfAssignments": {"type": "integer"},
            "memoryMap": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                "total": {"type": "integer"},
                "systemReserved": {"type": "integer"},
                "allocatable": {"type": "integer"},
                "reserved": {"type": "integer"},
                "free": {"type": "integer"}
            }}},
            "cells": {"type": "array", "items": {"type": "integer"}}
        }}}
    }})
}

/// One line of the map watch's stream.
fn watch_event_schema() -> Value {
    let mut schema = json!({"type": "object", "required": ["type", "epoch", "generation", "agentVersion"], "properties": {
        "type": {"enum": ["SNAPSHOT", "MODIFIED", "BOOKMARK"]},
        "epoch": {"type": "string", "description": "new at each start of the agent"},
        "generation": {"type": "integer", "description": "the state's; a new state has a higher one"},
        "object": {"type": "object", "description": "the state (absent on BOOKMARK)", "properties": {
            "source": {"enum": ["ebpf+sysfs", "sysfs"]},
            "selectionInputs": {"type": "integer", "description": "changes of the kubelet's settings and the Memory Manager's state seen since the agent started"},
            "gate": {"enum": ["on", "off"], "description": "the verification's gate (the kubelet's MemoryManagerHugepagesVerification, or --verification)"},
            "mode": {"enum": ["kep", "strict"]},
            "numaSelection": {"enum": ["nodeWide", "kubelet"], "description": "nodeWide: the Memory Manager policy is None and a pod's hugepages are verified on every node; kubelet: its hints and the Topology Manager policy select the nodes (see kubeletSelection)"},
            "pressureRefusal": {"type": "string", "description": "while every hugepage admission is refused under memory contention pressure (--reject-under-pressure), the message"},
            "kubeletSelection": kubelet_selection_schema(),
            "system": {"type": "array", "items": {"type": "object", "properties": {
                "pageSizeBytes": {"type": "integer"},
                "reserved": {"type": "integer", "description": "resv_hugepages: promised to mappings, not faulted yet"}
            }}},
            "reservations": {"type": "array", "description": "the agent's reservations in force", "items": {"$ref": "#/components/schemas/Reservation"}},
            "nodes": {"type": "array", "items": {"type": "object", "properties": {
                "node": {"type": "integer"},
                "sizes": {"type": "array", "items": {"type": "object", "properties": {
                    "pageSizeBytes": {"type": "integer"}, "total": {"type": "integer"}, "free": {"type": "integer"},
                    "reservedByAgent": {"type": "integer", "description": "bytes reserved for admitted pods that may draw from this node"},
                    "unreservedBytes": {"type": "integer", "description": "free bytes not held by a reservation"},
                    "stale": {"type": "boolean", "description": "the pool's files could not be read: the last good figures"}
                }}}
            }}}
        }}
    }});
    schema["properties"]["agentVersion"] = json!({"type": "string", "description": "the agent's version, on every event; the webhook reports agents outside its version-skew policy (its minor version or the next one)"});
    schema
}

fn problem(description: &str) -> Value {
    json!({"description": description, "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}})
}

/// `POST /v1/hints`.
fn hints_path() -> Value {
    json!({"post": {
        "summary": "The kubelet Memory Manager's topology hints for a request, on the live state",
        "description": "Same body as /v1/admit. `hints` are the pod's (pod scope), `containers` each container's (container scope), `null` for pods that are not Guaranteed, `{}` where no NUMA mask fits; `selection` is the merged hint and allocation under the policy and scope. `source` says whether the state is the kubelet's checkpoint or built from sysfs.",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"oneOf": [
            {"$ref": "#/components/schemas/AdmitShort"},
            {"$ref": "#/components/schemas/Pod"}
        ]}}}},
        "responses": {
            "200": {"description": "Hints", "content": {"application/json": {"schema": {"type": "object", "properties": {
                "hints": {"$ref": "#/components/schemas/Hints"},
                "containers": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "hints": {"$ref": "#/components/schemas/Hints"}}}},
                "selection": selection_schema(),
                "source": {"enum": ["checkpoint", "sysfs"]},
                "checkpointPath": {"type": "string"},
                "checkpointError": {"type": "string"},
                "unusable": {"type": "string", "description": "why no state could be built (reserved memory beyond a node: the kubelet would not start with it); the state is then empty"},
                "loadedAt": {"type": "string", "format": "date-time"}
            }}}}},
            "400": problem("Invalid JSON, or an invalid field (named in `field`)"),
            "408": problem("The body did not arrive within --body-read-timeout (type body-timeout); the connection is closed"),
            "413": problem("Body larger than 1 MiB, or a pod of more containers (app and init together) than --max-containers (type too-many-containers)"),
            "503": problem("No room in --body-budget for the body within a second (type body-budget-full): retry after the Retry-After header's seconds; or, without numaNodes, no NUMA selection as the kubelet would make it, because it would not start with its settings on this machine (type no-kubelet-selection, GET /v1/kubelet)"),
            "415": problem("Content type is not application/json")
        }
    }})
}

/// `GET /v1/discrepancy`.
fn discrepancy_path() -> Value {
    json!({"get": {
        "summary": "The kubelet Memory Manager's free hugepages against the kernel's, per NUMA node and size (KEP-5759's proposed discrepancy)",
        "description": "discrepancyBytes = the checkpoint's free minus free_hugepages x page size; positive means the kubelet would admit against pages that are gone. `untracked` names the cgroups holding pages on that node that the Memory Manager does not track (pods absent from its assignments, system cgroups, pages outside any cgroup), `heldByNothingThatRuns` names, as a cause of its own, the hugetlbfs files and SysV segments of that size that hold pages while no process maps, holds or attaches them (the kubelet never counts them; their node is often not known), and `explanation` says it in a sentence. Without a usable checkpoint `nodes` is empty and `note` says why.",
        "responses": {"200": {"description": "Per node and size", "content": {"application/json": {"schema": {"type": "object", "properties": {
            "source": {"enum": ["checkpoint", "sysfs"]},
            "machineState": {"type": "object", "description": "The Memory Manager's view per NUMA node: memoryMap (per resource: total, systemReserved, allocatable, reserved, free) and cells (the node's group)"},
            "note": {"type": "string"},
            "nodes": {"type": "array", "items": {"type": "object", "properties": {
                "numaNode": {"type": "integer"}, "resource": {"type": "string"}, "pageSizeBytes": {"type": "integer"},
                "memoryManagerFreeBytes": {"type": "integer"}, "osFreeBytes": {"type": "integer"}, "discrepancyBytes": {"type": "integer"},
                "untracked": {"type": "array", "items": {"type": "object", "properties": {"cgroup": {"type": "string"}, "podUid": {"type": "string"}, "qos": {"type": "string"}, "bytes": {"type": "integer"}}}},
                "heldByNothingThatRuns": {"type": "array", "items": {"type": "object", "required": ["kind", "name", "bytes", "nodeKnown"], "properties": {"kind": {"enum": ["hugetlbfsFile", "sysvSegment", "memfd"]}, "name": {"type": "string", "description": "the file's path, or shmid <id>"}, "bytes": {"type": "integer", "description": "on this node, or in all when nodeKnown is false"}, "nodeKnown": {"type": "boolean"}}}},
                "explanation": {"type": "string"}
            }}}
        }}}}}}
    }})
}

/// `GET /v1/kubelet`.
fn kubelet_path() -> Value {
    json!({"get": {
        "summary": "The node's kubelet settings the agent selects NUMA nodes with, each with its value and source",
        "description": "Read from the running kubelet (the one process named kubelet that is the host's: not in a pod's or a container's cgroup, not in a PID namespace of its own, its / the host's root mount; its command line, its --config file and --config-dir drop-ins; with two or more such processes none is followed and, without --kubelet-config, `error` says so), else --kubelet-config or the places installers write it, else the kubelet's defaults; the agent's flags override. Re-read when the kubelet restarts or a file changes. A reading that fails keeps the settings in use, names the file and field in `error`, and every source then says it was kept.",
        "responses": {"200": {"description": "The settings in use", "content": {"application/json": {"schema": {"type": "object", "required": ["origin", "settings", "loadedAt"], "properties": {
            "origin": {"type": "string", "description": "where the settings came from: the kubelet's pid and files, a file, or the kubelet's defaults"},
            "error": {"type": "string", "description": "why the latest reading was not used (file and field named)"},
            "refusal": {"type": "string", "description": "why the kubelet would not start with these settings on this machine (its Topology Manager: more NUMA nodes than max-allowable-numa-nodes under a policy other than none, or options it does not know), when so; the agent runs on, and admissions without numaNodes are refused (503, type no-kubelet-selection)"},
            "candidates": {"type": "array", "description": "every process named kubelet the latest reading looked at, oldest first", "items": {"type": "object", "required": ["pid"], "properties": {
                "pid": {"type": "integer"},
                "refused": {"type": "string", "description": "why it is not taken for the host's kubelet (its cgroup is a pod's or a container's, its PID namespace or root mount is not the host's, or a file that shows it cannot be read); absent: it looks like the host's"}
            }}},
            "settings": {"type": "object", "description": "KubeletConfiguration field name (feature gates as featureGates.<Name>) to its value and source", "additionalProperties": {"type": "object", "required": ["value", "source"], "properties": {
                "value": {"type": "string"},
                "source": {"type": "string", "examples": ["kubelet command line (pid 1234)", "file /var/lib/kubelet/config.yaml", "drop-in /etc/kubernetes/kubelet/config.json.d/50-numa.conf", "flag --topology-policy", "kubelet default"]}
            }}},
            "loadedAt": {"type": "string", "format": "date-time"}
        }}}}}}
    }})
}

/// How the nodes were chosen, in `selection`.
fn selection_schema() -> Value {
    json!({"type": "object", "properties": {
        "basis": {"enum": ["static-policy", "node-wide", "request"], "description": "static-policy: the Memory Manager's hints merged under the Topology Manager policy, then Allocate; node-wide: the kubelet's Memory Manager policy is None, which pins nothing, so the pod is verified on every NUMA node"},
        "note": {"type": "string"},
        "admit": {"type": "boolean"},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "placements": {"type": "array", "items": {"type": "object"}}
    }})
}

/// The request bodies' schemas: what `POST /v1/admit` and `POST /v1/hints` accept, exactly (the
/// identifiers' patterns and limits are [`identifiers`]'s own; `null` stands for a field left out
/// wherever the field is optional).
fn request_schemas(nodes: &[u32]) -> Value {
    json!({
            "Quantity": {"description": "A Kubernetes quantity (4Gi, 2048Mi, 1.5Gi, 4194304) or a number of bytes", "oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": u64::MAX}]},
            "ResourceList": {
                "type": ["object", "null"],
                "description": "Resource name (a Kubernetes qualified name: an optional DNS subdomain of at most 253 characters and '/', then at most 63 letters, digits, '-', '_' or '.') to quantity. hugepages-<size> entries are verified: <size> a power of two of at least 4Ki, the amount a whole multiple of it; memory and cpu count for the QoS class and the Memory Manager's hints; others are not read. null is an empty list.",
                "propertyNames": {"pattern": QUALIFIED_NAME},
                "additionalProperties": {"$ref": "#/components/schemas/Quantity"}
            },
            "ShortPod": {
                "type": ["object", "null"],
                "description": "Who is asking; null or absent: no one named (nothing is reserved without a uid)",
                "properties": {
                    "namespace": identifier(identifiers::LABEL_PATTERN, identifiers::LABEL_MAX, "a DNS-1123 label"),
                    "name": identifier(identifiers::SUBDOMAIN_PATTERN, identifiers::SUBDOMAIN_MAX, "a DNS-1123 subdomain"),
                    "uid": identifier(identifiers::UID_PATTERN, identifiers::UID_LENGTH, "an RFC 4122 UUID in lowercase, as the API server assigns it; an admitted request with a uid reserves its pages"),
                    "qosClass": qos_class()
                }
            },
            "AdmitShort": {
                "type": "object",
                "required": ["containers"],
                "additionalProperties": false,
                "properties": {
                    "pod": {"$ref": "#/components/schemas/ShortPod"},
                    "containers": {"type": "array", "description": "names unique within the pod", "items": {"type": "object", "properties": {
                        "name": identifier(identifiers::LABEL_PATTERN, identifiers::LABEL_MAX, "a DNS-1123 label, unique within the pod; absent, null or empty: container-<index>"),
                        "resources": {"$ref": "#/components/schemas/ResourceList", "description": "requests and limits at once"}
                    }}},
                    "numaNodes": {"type": ["array", "null"], "minItems": 1, "items": {"type": "integer", "enum": nodes}, "description": "the NUMA nodes to verify, each a node of this machine (this document is this agent's: the enum lists its machine's nodes); absent or null: selected as the kubelet would"},
                    "topologyPolicy": {"enum": ["none", "best-effort", "restricted", "single-numa-node", null], "description": "absent or null: the node's kubelet's (GET /v1/kubelet)"},
                    "scope": {"enum": ["container", "pod", null], "description": "absent or null: the node's kubelet's (GET /v1/kubelet)"}
                }
            },
            "Requirements": {"type": ["object", "null"], "properties": {
                "requests": {"$ref": "#/components/schemas/ResourceList"},
                "limits": {"$ref": "#/components/schemas/ResourceList"}
            }},
            "Container": {"type": "object", "properties": {
                "name": identifier(identifiers::LABEL_PATTERN, identifiers::LABEL_MAX, "a DNS-1123 label, unique among the pod's containers and init containers; absent, null or empty: container-<index> (init-container-<index>)"),
                "resources": {"$ref": "#/components/schemas/Requirements"},
                "restartPolicy": {"type": ["string", "null"], "description": "Always on an init container makes it a sidecar"}
            }},
            "Pod": {
                "type": "object",
                "required": ["spec"],
                "description": "A Kubernetes v1.Pod; containers, initContainers (restartPolicy Always = sidecar), overhead and pod-level resources are read, other fields are not. null is the field left out.",
                "properties": {
                    "metadata": {"type": ["object", "null"], "properties": {
                        "namespace": identifier(identifiers::LABEL_PATTERN, identifiers::LABEL_MAX, "a DNS-1123 label"),
                        "name": identifier(identifiers::SUBDOMAIN_PATTERN, identifiers::SUBDOMAIN_MAX, "a DNS-1123 subdomain"),
                        "uid": identifier(identifiers::UID_PATTERN, identifiers::UID_LENGTH, "an RFC 4122 UUID in lowercase, as the API server assigns it; an admitted pod with a uid reserves its pages")
                    }},
                    "spec": {"type": "object", "properties": {
                        "containers": {"type": ["array", "null"], "items": {"$ref": "#/components/schemas/Container"}},
                        "initContainers": {"type": ["array", "null"], "items": {"$ref": "#/components/schemas/Container"}},
                        "overhead": {"$ref": "#/components/schemas/ResourceList"},
                        "resources": {"$ref": "#/components/schemas/Requirements"}
                    }},
                    "status": {"type": ["object", "null"], "properties": {"qosClass": qos_class()}}
                }
            }
    })
}

/// The whole document, for an agent on a machine whose NUMA nodes are `nodes`.
/// The holders of `GET /v1/consumers` (`crate::holders`).
fn holder_schemas() -> Value {
    json!({
            "Holder": {"type": "object", "required": ["kind", "pageSizeBytes", "heldBytes", "heldByNothingThatRuns", "nodesFrom"], "properties": {
                "kind": {"enum": ["hugetlbfsFile", "sysvSegment", "memfd", "unexplained"]},
                "pageSizeBytes": {"type": "integer"}, "heldBytes": {"type": "integer", "description": "bytes of hugepages it holds"},
                "heldByNothingThatRuns": {"type": "boolean", "description": "no process maps it, holds it open or attaches it"},
                "perNode": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "NUMA node to bytes, as far as nodesFrom says"},
                "nodesFrom": {"enum": ["mappings", "someMappings", "queried", "unknown"], "description": "mappings: every page is mapped by a process and numa_maps places it; someMappings: only the mapped pages are placed; queried: the agent asked the kernel through a private read-only mapping of its own (move_pages); unknown: none of these, nodesNote says why"},
                "nodesNote": {"type": "string", "description": "why the nodes are not known, or known only in part"},
                "path": {"type": "string"}, "mountPoint": {"type": "string"}, "inode": {"type": "integer"},
                "deleted": {"type": "boolean", "description": "unlinked, held by the processes that map it or hold it open"},
                "podVolume": {"type": "object", "required": ["podUid", "volume"], "properties": {"podUid": {"type": "string"}, "volume": {"type": "string"}}, "description": "the kubelet's emptyDir of medium HugePages the mount is"},
                "shmid": {"type": "integer"}, "key": {"type": "string"}, "sizeBytes": {"type": "integer"}, "attached": {"type": "integer", "description": "nattch"},
                "ipcNamespace": {"type": "string", "description": "a segment of an IPC namespace other than the agent's (a pod's), seen through the processes that attach it"},
                "creator": {"$ref": "#/components/schemas/NamedPid"}, "lastAttach": {"$ref": "#/components/schemas/NamedPid"},
                "knownBy": {"enum": ["mapping", "faults", "rss", "accounting"], "description": "how the segment is known to be hugepages': a process attaches it (numa_maps marks it huge); the probes saw hugetlb faults taken in it while the agent ran; its rss is above its size (kernels that count a hugepage's base pages twice over there); or the pages in use that nothing else explains add up to the rss of it (with the other segments so found) and of no other set of segments nothing attaches"},
                "candidateShmids": {"type": "array", "items": {"type": "integer"}, "description": "unexplained: SysV segments not attached whose backing the kernel does not show"},
                "users": {"type": "array", "items": {"type": "object", "required": ["pid", "command", "maps"], "properties": {
                    "pid": {"type": "integer"}, "command": {"type": "string"}, "maps": {"type": "boolean"},
                    "openFds": {"type": "array", "items": {"type": "integer"}},
                    "cgroup": {"type": "string"}, "podUid": {"type": "string"}, "containerId": {"type": "string"}
                }}},
                "probes": {"type": "object", "required": ["faults"], "description": "what the eBPF probes saw of it while the agent ran: who made it (hugetlbfs_alloc_inode, kernels newer than 6.12; files of mounts only), who took its first and last hugetlb faults, what fallocate(2) gave it", "properties": {
                    "madeBy": {"$ref": "#/components/schemas/Witness"}, "firstFaultBy": {"$ref": "#/components/schemas/Witness"}, "lastFaultBy": {"$ref": "#/components/schemas/Witness"},
                    "faults": {"type": "integer", "description": "hugetlb faults taken in it"},
                    "fallocatedBytes": {"type": "integer", "description": "bytes successful fallocate(2) calls asked for since the agent started: a range asked twice counts twice; punched holes and truncations do not subtract"}
                }}
            }},
            "Witness": {"type": "object", "required": ["pid", "command", "running", "cgroupId", "at"], "description": "a process as the probes saw it act", "properties": {
                "pid": {"type": "integer"}, "command": {"type": "string"}, "running": {"type": "boolean", "description": "a process of that pid runs now (pids are reused)"},
                "cgroupId": {"type": "integer", "description": "the cgroup v2 id the kernel gave with the event (its directory's inode number)"}, "cgroup": {"type": "string", "description": "that cgroup's path, when the agent read it while the process was still in it"}, "podUid": {"type": "string"}, "containerId": {"type": "string"},
                "at": {"type": "string", "format": "date-time"}
            }},
            "NamedPid": {"type": "object", "required": ["pid", "running"], "properties": {"pid": {"type": "integer"}, "running": {"type": "boolean", "description": "a process of that pid runs now (pids are reused)"}}},
            "Account": {"type": "object", "required": ["pageSizeBytes", "inUseBytes", "privateBytes", "sharedAnonymousBytes", "filesBytes", "segmentsBytes", "memfdsBytes", "heldByNothingThatRunsBytes", "unexplainedBytes"], "properties": {
                "pageSizeBytes": {"type": "integer"}, "inUseBytes": {"type": "integer", "description": "(nr_hugepages - free_hugepages) x size"},
                "privateBytes": {"type": "integer"}, "sharedAnonymousBytes": {"type": "integer"}, "filesBytes": {"type": "integer"},
                "segmentsBytes": {"type": "integer"}, "memfdsBytes": {"type": "integer"},
                "heldByNothingThatRunsBytes": {"type": "integer"},
                "heldByNothingThatRunsPerNode": {"type": "object", "additionalProperties": {"type": "integer"}},
                "unexplainedBytes": {"type": "integer"}
            }}
    })
}

pub fn document(nodes: &[NumaNode]) -> Value {
    let nodes: Vec<u32> = nodes.iter().map(|n| n.0).collect();
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "hugepage-agent",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Per-NUMA hugepage verification for Kubernetes nodes (KEP-5759 semantics). Who may call what: with --client-ca-file every client presents a certificate of that CA; a certificate whose common name or a DNS name is in --admit-client-names (default hugepage-agent-webhook, the webhook's client certificate) may call everything; any other certificate of the CA may read (the GET routes, POST /v1/hints, POST /v1/admit?dryRun=true) and is answered 403 on a real admission and on DELETE /v1/reservations/{id}, nothing changed. Without --client-ca-file (loopback) nothing is checked."
        },
        "paths": {
            "/v1/admit": {"post": {
                "summary": "Can this pod's hugepage request be served on these NUMA nodes, right now?",
                "description": "free_hugepages is read fresh for the selected NUMA nodes. Without numaNodes they are selected as the node's kubelet would (its settings: GET /v1/kubelet): the Memory Manager's hints (static policy, on its checkpoint or the state built from sysfs) merged under the Topology Manager policy (topologyPolicy, else the kubelet's), then its Allocate; a refusal there is the kubelet's TopologyAffinityError or UnexpectedAdmissionError, and `selection` shows the hints and the merged hint. Under the kubelet's Memory Manager policy None nothing is pinned: `selection.basis` is node-wide and every NUMA node is verified. A rejection by the kernel carries the KEP-5759 message. The body is either the short form (containers' resources are requests and limits) or a whole v1.Pod. With dryRun=true the same verification and selection run on the same state (other pods' reservations subtracted) but nothing is reserved or written and the verification metrics do not count it; the answer says dryRun: true.",
                "parameters": [{"name": "dryRun", "in": "query", "required": false, "schema": {"type": "boolean"}, "description": "true: verify and select only, never reserve (what the scheduler extender asks every candidate node); absent or false: a real admission"}],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"oneOf": [
                    {"$ref": "#/components/schemas/AdmitShort"},
                    {"$ref": "#/components/schemas/Pod"}
                ]}}}},
                "responses": {
                    "200": {"description": "The verdict (allowed or not)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Verdict"}}}},
                    "400": problem("Invalid JSON, an invalid field (named in `field`), or a dryRun that is not true or false"),
                    "403": problem("A real admission (dryRun absent or false) by a client certificate none of whose names is in --admit-client-names (type forbidden; detail names the certificate's names): nothing read or reserved"),
                    "408": problem("The body did not arrive within --body-read-timeout (type body-timeout); the connection is closed"),
            "413": problem("Body larger than 1 MiB, or a pod of more containers (app and init together) than --max-containers (type too-many-containers)"),
            "503": problem("No room in --body-budget for the body within a second (type body-budget-full): retry after the Retry-After header's seconds; or, without numaNodes, no NUMA selection as the kubelet would make it, because it would not start with its settings on this machine (type no-kubelet-selection, GET /v1/kubelet)"),
                    "409": problem("A real admission of a pod UID reserved for another namespace or name (type reservation-conflict, both named in detail): nothing is reserved or replaced"),
                    "415": problem("Content type is not application/json"),
                    "500": problem("The reservation could not be saved (type state-write-failed, the file and the error named in detail): a disk fault on the node, not a verdict")
                }
            }},
            "/v1/hints": hints_path(),
            "/v1/discrepancy": discrepancy_path(),
            "/v1/kubelet": kubelet_path(),
            "/v1/hugepages": hugepages_path(),
            "/v1/consumers": {"get": {
                "summary": "Who holds the hugepages: pods, containers and system cgroups, and the files, SysV segments and memfds that hold pages, held by nothing that runs or not, read fresh, largest first",
                "description": "consumers: every pod and container cgroup (pod UID, QoS and container id from the kubelet's cgroup path, either driver) and every other top-level cgroup charged with hugepages by the hugetlb controller, per size and NUMA node, with the hugetlb faults the probes saw there. A 'system' entry for '/' holds what the pools show in use beyond every top-level cgroup. holders: every hugetlbfs file of the host's mounts that holds pages, every SysV segment hugepages back, every hugetlb memfd still open, with the processes that map or hold each one (pid, command, cgroup, pod) and heldByNothingThatRuns when none does; an 'unexplained' holder per size for what the pools show in use and nothing explains. accounts: per size, what is in use and what explains it. unread: what the walk could not read (without CAP_SYS_PTRACE the agent reads other processes' mappings through its task iterators, which do not place their pages on nodes; without probes it cannot read them). The agent never deletes, detaches or writes what it finds; to place a file's pages no process maps, it maps the file private and read-only for one query. heldByNothingThatRuns is claimed only when every process that maps hugepages could be read.",
                "responses": {
                    "200": {"description": "Consumers and holders", "content": {"application/json": {"schema": {"type": "object", "required": ["consumers", "holders", "accounts"], "properties": {
                        "consumers": {"type": "array", "items": {"$ref": "#/components/schemas/Consumer"}},
                        "holders": {"type": "array", "items": {"$ref": "#/components/schemas/Holder"}},
                        "accounts": {"type": "array", "items": {"$ref": "#/components/schemas/Account"}},
                        "unread": {"type": "array", "items": {"type": "object", "required": ["what", "error"], "properties": {"what": {"type": "string"}, "error": {"type": "string"}}}}
                    }}}}},
                    "500": problem("A hugetlb file, the host's /proc or a pool could not be read (named in detail)")
                }
            }},
            "/v1/reservations": {"get": {
                "summary": "Hugepages reserved for admitted pods that have not faulted them yet",
                "description": "An admitted request with a pod UID reserves its bytes per size on its NUMA nodes; later admissions of other pods subtract them. A reservation ends when the pod's cgroup has faulted its pages, when the pod's cgroup is removed, after --reservation-ttl, or on DELETE. Reservations survive restarts.",
                "responses": {"200": {"description": "Reservations", "content": {"application/json": {"schema": {"type": "object", "properties": {"reservations": {"type": "array", "items": {"$ref": "#/components/schemas/Reservation"}}}}}}}}
            }},
            "/v1/reservations/{id}": {"delete": {
                "summary": "End a reservation now",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "The removed reservation", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Reservation"}}}},
                    "404": problem("No such reservation"),
                    "403": problem("A client certificate none of whose names is in --admit-client-names (type forbidden): nothing released")
                }
            }},
            "/v1/conditions": {"get": {
                "summary": "PSI-based node conditions (KEP-5394) with the readings behind them",
                "description": "SystemMemoryContentionPressure, SystemDiskContentionPressure, KubepodsMemoryContentionPressure, KubepodsDiskContentionPressure as Kubernetes NodeConditions (status Unknown while a scope cannot be read); the last reading of every pressure file (cpu included, which is reported but not a condition); where each scope's files are or why they are unavailable; and which PSI triggers are armed.",
                "responses": {"200": {"description": "Conditions and readings", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Conditions"}}}}}
            }},
            "/v1/events": {"get": {
                "summary": "Recent PSI events, oldest first (at most 256)",
                "responses": {"200": {"description": "Events", "content": {"application/json": {"schema": {"type": "object", "properties": {"events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}}}}}}}
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics: KEP-5759's verification metrics and hugepage_agent_*",
                "description": "The Prometheus text format (0.0.4), or OpenMetrics 1.0 when the Accept header names application/openmetrics-text.",
                "responses": {"200": {"description": "The exposition", "content": {"text/plain": {"schema": {"type": "string"}}, "application/openmetrics-text": {"schema": {"type": "string"}}}}}
            }},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "The process serves requests"}}}},
            "/readyz": {"get": {
                "summary": "Readiness: the first map exists and the probes are attached, refused or off",
                "responses": {"200": {"description": "Ready", "content": {"application/json": {"schema": {"type": "object", "required": ["ready", "source", "generation", "probes"], "properties": {
                    "ready": {"const": true},
                    "source": {"enum": ["sysfs", "ebpf+sysfs"]},
                    "generation": {"type": "integer"},
                    "probes": {"type": "string", "description": "attached, off (--ebpf off) or refused: why"},
                    "kubelet": {"type": "string", "description": "why the kubelet would not start with its settings on this machine, when so (GET /v1/kubelet): ready all the same, without the kubelet's NUMA selection"}
                }}}}}, "503": problem("Still starting")}
            }},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}}
        },
        "components": {"schemas": {
            "Hints": {"description": "Resource name to topology hints, as the kubelet returns them; null when it returns none", "type": ["object", "null"], "additionalProperties": {"type": "array", "items": {"type": "object", "properties": {"numaNodes": {"type": ["array", "null"], "items": {"type": "integer"}}, "preferred": {"type": "boolean"}}}}},
            "Check": {"type": "object", "properties": {
                "resource": {"type": "string", "examples": ["hugepages-2Mi"]},
                "numaNodes": {"type": "array", "items": {"type": "integer"}},
                "requestedBytes": {"type": "integer"},
                "availableBytes": {"type": "integer", "description": "what the verification mode counts"},
                "freeBytes": {"type": "integer", "description": "free_hugepages summed (kep)"},
                "unreservedBytes": {"type": "integer", "description": "free minus reserved-but-untouched (strict)"},
                "reservedByAgentBytes": {"type": "integer", "description": "held for other admitted pods that have not faulted their pages; already subtracted from availableBytes"},
                "ok": {"type": "boolean"},
                "unverified": {"type": "string", "description": "why this size could not be read"}
            }},
            "Verdict": {"type": "object", "required": ["allowed", "numaNodes", "mode", "checks", "pod"], "properties": {
                "allowed": {"type": "boolean"},
                "reason": {"enum": ["FailedHugepagesVerification", "HugepagesVerificationUnavailable", "NodeUnderMemoryContentionPressure", "TopologyAffinityError", "UnexpectedAdmissionError"]},
                "message": {"type": "string", "examples": ["insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 6Gi, available 4Gi"]},
                "numaNodes": {"type": "array", "items": {"type": "integer"}},
                "mode": {"enum": ["kep", "strict"]},
                "checks": {"type": "array", "items": {"$ref": "#/components/schemas/Check"}},
                "reservation": {"type": "object", "description": "made when an admitted request names a pod UID", "properties": {"id": {"type": "string"}, "expiresAt": {"type": "string", "format": "date-time"}}},
                "pod": {"type": "object"},
                "selection": selection_schema(),
                "dryRun": {"const": true, "description": "present (true) on the answer of a dry run"}
            }},
            "WatchEvent": watch_event_schema(),
            "Snapshot": {"type": "object", "properties": {
                "generation": {"type": "integer"},
                "updatedAt": {"type": "string", "format": "date-time"},
                "source": {"enum": ["ebpf+sysfs", "sysfs"]},
                "faultToMapMicros": {"type": "integer", "description": "delay from a hugetlb fault to the snapshot that first showed the change it prompted: the last change, kept by the re-reads that change nothing after it; absent when the last change was found by a reconcile"},
                "nodes": {"type": "array", "items": {"type": "object", "properties": {
                    "node": {"type": "integer"}, "cpus": {"type": "array", "items": {"type": "integer"}}, "distances": {"type": "array", "items": {"type": "integer"}},
                    "sizes": {"type": "array", "items": {"type": "object", "properties": {
                        "pageSizeBytes": {"type": "integer"}, "total": {"type": "integer"}, "free": {"type": "integer"}, "surplus": {"type": "integer"},
                        "reservedByAgent": {"type": "integer", "description": "bytes reserved for admitted pods that may draw from this node"},
                        "stale": {"$ref": "#/components/schemas/Stale"}
                    }}}
                }}},
                "global": {"type": "array", "items": {"type": "object", "properties": {
                    "pageSizeBytes": {"type": "integer"}, "total": {"type": "integer"}, "free": {"type": "integer"}, "reserved": {"type": "integer"}, "surplus": {"type": "integer"},
                    "stale": {"$ref": "#/components/schemas/Stale"}
                }}}
            }},
            "Stale": {"type": "object", "description": "present while the pool's files cannot be read: its figures are the last good ones", "required": ["since", "error"], "properties": {
                "since": {"type": "string", "format": "date-time", "description": "the first read that failed"},
                "error": {"type": "string", "description": "the latest error, naming the file"}
            }},
            "Reservation": {"type": "object", "properties": {
                "id": {"type": "string"}, "podUid": {"type": "string"}, "namespace": {"type": "string"}, "name": {"type": "string"},
                "numaNodes": {"type": "array", "items": {"type": "integer"}},
                "bytes": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "page size in bytes to bytes reserved"},
                "createdAt": {"type": "integer", "description": "Unix milliseconds"}, "expiresAt": {"type": "integer", "description": "Unix milliseconds"}
            }},
            "Consumer": {"type": "object", "required": ["kind", "cgroup", "inUseBytes", "sizes", "faults"], "properties": {
                "kind": {"enum": ["pod", "container", "system"]},
                "podUid": {"type": "string"}, "qos": {"enum": ["Guaranteed", "Burstable", "BestEffort"]}, "containerId": {"type": "string"},
                "cgroup": {"type": "string"}, "inUseBytes": {"type": "integer"},
                "sizes": {"type": "array", "items": {"type": "object", "properties": {
                    "pageSizeBytes": {"type": "integer"}, "inUseBytes": {"type": "integer"}, "reservedBytes": {"type": "integer"},
                    "perNode": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "NUMA node to bytes in use"}
                }}},
                "faults": {"type": "integer"},
                "firstFault": {"type": "string", "format": "date-time"}, "lastFault": {"type": "string", "format": "date-time"}
            }},
            "NodeCondition": {"type": "object", "required": ["type", "status", "reason", "message", "lastTransitionTime", "lastHeartbeatTime"], "properties": {
                "type": {"type": "string", "examples": ["SystemMemoryContentionPressure"]},
                "status": {"enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string"}, "message": {"type": "string", "description": "the values that decided it"},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "lastHeartbeatTime": {"type": "string", "format": "date-time"}
            }},
            "Event": {"type": "object", "properties": {
                "type": {"enum": ["Normal", "Warning"]}, "reason": {"type": "string"}, "message": {"type": "string"},
                "scope": {"enum": ["system", "kubepods"]}, "resource": {"enum": ["memory", "io", "cpu"]},
                "time": {"type": "string", "format": "date-time"}
            }},
            "Conditions": {"type": "object", "properties": {
                "conditions": {"type": "array", "items": {"$ref": "#/components/schemas/NodeCondition"}},
                "readings": {"type": "array", "items": {"type": "object", "properties": {
                    "scope": {"enum": ["system", "kubepods"]}, "resource": {"enum": ["memory", "io", "cpu"]}, "file": {"type": "string"},
                    "some": {"$ref": "#/components/schemas/PressureLine"}, "full": {"$ref": "#/components/schemas/PressureLine"}
                }}},
                "scopes": {"type": "object"},
                "triggers": {"type": "array", "items": {"type": "object", "properties": {"file": {"type": "string"}, "armed": {"type": "boolean"}, "why": {"type": "string"}}}}
            }},
            "PressureLine": {"type": "object", "properties": {"avg10": {"type": "number"}, "avg60": {"type": "number"}, "avg300": {"type": "number"}, "total": {"type": "integer", "description": "microseconds"}}},
            "Problem": {"type": "object", "description": "RFC 9457 problem details", "required": ["type", "title", "status", "detail"], "properties": {
                "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"},
                "field": {"type": "string", "description": "the request field at fault"}
            }}
        }}
    });
    if let (Some(schemas), Value::Object(requests)) = (
        doc["components"]["schemas"].as_object_mut(),
        request_schemas(&nodes),
    ) {
        schemas.extend(requests);
    }
    if let (Some(schemas), Value::Object(holders)) = (
        doc["components"]["schemas"].as_object_mut(),
        holder_schemas(),
    ) {
        schemas.extend(holders);
    }
    doc
}
