//! The kubelet Topology Manager's arithmetic: its vocabulary ([`policy`]: policies, options,
//! hints), the machine's NUMA nodes as it reads them ([`numa_info`]), masks in the kubelet's
//! order ([`bitmask`]), what it needs to start ([`manager`]), and the merge of hint providers'
//! topology hints under a policy ([`merge`]), giving the kubelet's merged hint and its
//! admit/reject decision case for case.

pub mod bitmask;
pub mod manager;
pub mod merge;
pub mod numa_info;
pub mod policy;

pub use bitmask::NumaMask;
pub use merge::Merged;
pub use numa_info::NumaInfo;
pub use policy::{Policy, PolicyOptions, ProviderHints, TopologyHint};
