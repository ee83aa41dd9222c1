//! hugepage-agent: a Kubernetes node agent that knows, per NUMA node, how many hugepages the kernel
//! really has free, and who took the rest.
//!
//! Modules, from the kernel outwards: [`sysfs`] is the only reader of `/sys` and `/proc`;
//! [`probes`] owns the eBPF programs and turns their records into events; [`numa`] holds the
//! hugepage pools; [`run`] is the agent's event loop and [`status`] the one-shot table;
//! [`telemetry`] is the log, OTLP traces and Prometheus metrics.

pub mod admission;
pub mod api;
pub mod check;
pub mod client;
pub mod config;
pub mod consumers;
pub mod doctor;
pub mod flags;
pub mod footprint;
pub mod holders;
pub mod host;
pub mod kube;
pub mod kubelet;
pub mod kubeletconfig;
pub mod logging;
pub mod memorymanager;
pub mod numa;
pub mod probes;
pub mod psi;
pub mod quantity;
pub mod run;
pub mod runloop;
pub mod status;
pub mod sysfs;
pub mod telemetry;
pub mod tls;
pub mod topologymanager;
pub mod webhook;
pub mod whatif;
