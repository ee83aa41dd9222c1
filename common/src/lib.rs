//! Types shared by the kernel programs (`ebpf/`) and the agent (`agent/`).
//!
//! Everything that crosses the kernel boundary lives here: ring-buffer records, map keys and
//! values, map names, and the layout of the read-only offsets the agent fills in from the kernel's
//! BTF at load time. Every struct is `#[repr(C)]` with explicit padding so that both sides agree on
//! the bytes; with the `user` feature the structs implement `aya::Pod` for the agent.
#![no_std]

pub mod cgroup;
pub mod counters;
pub mod hugetlbfs;
pub mod offsets;
pub mod page_fault_user;
pub mod tasks;
