//! The kubelet Memory Manager, seen from outside: its state (from the kubelet's checkpoint or
//! built from sysfs), the static policy's topology hints, and the gap between what it believes is
//! free and what the kernel has.

pub mod checkpoint;
pub mod discrepancy;
pub mod hints;
pub mod live;
pub mod machine;
pub mod requests;
pub mod selection;
pub mod state;
pub mod streamed;

#[cfg(test)]
pub(crate) mod testing;
