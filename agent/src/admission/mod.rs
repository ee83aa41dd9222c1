//! Admission: what a pod asks of hugepages ([`request`]) and whether the kernel can serve it on
//! the selected NUMA nodes right now ([`verify`], KEP-5759's check, read fresh from sysfs), and
//! what admitted pods hold until they start ([`reservations`]); the pod's identifiers are checked
//! as the API server checks them ([`identifiers`]) before any of it.

pub mod identifiers;
pub mod json;
pub mod plan;
pub mod release;
pub mod request;
pub mod reservations;
pub mod verify;
