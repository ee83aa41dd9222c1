//! The kubelet feature gates that change hint generation (`PodLevelResources`,
//! `PodLevelResourceManagers`), as NUMA selection reads them; where they are set is
//! [`crate::kubeletconfig`]'s.

/// The gates, off unless set (as in the kubelet releases that have them as alpha).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// Pod-level `spec.resources` count for QoS and requests.
    pub pod_level_resources: bool,
    /// The resource managers (the Memory Manager among them) honour pod-level resources.
    pub pod_level_resource_managers: bool,
}
