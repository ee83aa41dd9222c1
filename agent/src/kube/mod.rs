//! The Kubernetes object model, as the agent reads it from the API's bodies and the kubelet's
//! rules: a pod, its containers and their resource requests ([`pod`]: quantities as requests,
//! hugepages per page size, the kubelet's rules for a pod's total), identifiers checked as the API
//! server checks them ([`identifiers`]), and how JSON fields are read as Go's `omitempty` writes
//! them ([`json`]). Below admission, the Memory Manager and the cluster side alike: none of them
//! is imported here.

pub mod identifiers;
pub mod json;
pub mod pod;
