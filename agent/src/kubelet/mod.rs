//! What the agent knows of the kubelet without asking an API server: which pod and container a
//! cgroup belongs to, from the cgroup's path ([`cgroup_path`]), and where each pod's cgroup is
//! ([`pods`]).

pub mod cgroup_path;
pub mod features;
pub mod pods;
