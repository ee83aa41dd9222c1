//! The kubelet Topology Manager's arithmetic: NUMA masks in the kubelet's order and the merge of
//! hint providers' topology hints under a policy (`none`, `best-effort`, `restricted`,
//! `single-numa-node`, with the `prefer-closest-numa-nodes` option), giving the kubelet's merged
//! hint and its admit/reject decision case for case.

pub mod bitmask;
pub mod merge;

pub use bitmask::NumaMask;
pub use merge::{Merged, NumaInfo, Policy, PolicyOptions, ProviderHints, TopologyHint};
