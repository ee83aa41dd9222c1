//! The kubelet feature gates that change hint generation, set as the kubelet spells them:
//! `--feature-gates PodLevelResources=true,PodLevelResourceManagers=true`.

use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureGateError {
    #[error("feature gate {0:?} is not NAME=true|false")]
    Syntax(String),
    #[error(
        "unrecognized feature gate {0:?}: PodLevelResources and PodLevelResourceManagers are known"
    )]
    Unknown(String),
}

/// The gates, off unless set (as in the kubelet releases that have them as alpha).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// Pod-level `spec.resources` count for QoS and requests.
    pub pod_level_resources: bool,
    /// The resource managers (the Memory Manager among them) honour pod-level resources.
    pub pod_level_resource_managers: bool,
}

impl FromStr for FeatureGates {
    type Err = FeatureGateError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut gates = FeatureGates::default();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let syntax = || FeatureGateError::Syntax(pair.to_string());
            let (name, value) = pair.split_once('=').ok_or_else(syntax)?;
            let on = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(syntax()),
            };
            match name.trim() {
                "PodLevelResources" => gates.pod_level_resources = on,
                "PodLevelResourceManagers" => gates.pod_level_resource_managers = on,
                other => return Err(FeatureGateError::Unknown(other.to_string())),
            }
        }
        Ok(gates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kubelets_spelling() {
        let gates: FeatureGates = "PodLevelResources=true, PodLevelResourceManagers=True"
            .parse()
            .unwrap();
        assert!(gates.pod_level_resources && gates.pod_level_resource_managers);
        assert_eq!("".parse::<FeatureGates>().unwrap(), FeatureGates::default());
        assert_eq!(
            "PodLevelResources".parse::<FeatureGates>(),
            Err(FeatureGateError::Syntax("PodLevelResources".into()))
        );
        assert_eq!(
            "CPUManager=true".parse::<FeatureGates>(),
            Err(FeatureGateError::Unknown("CPUManager".into()))
        );
    }
}
