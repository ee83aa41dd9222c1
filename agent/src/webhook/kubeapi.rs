//! The webhook's client of the Kubernetes API: from `--kubeconfig` when it is given (its current
//! context), else the in-cluster configuration a pod has (the ServiceAccount's token and CA, and
//! `KUBERNETES_SERVICE_HOST`/`_PORT`). The calls made with it are few and named by the
//! ClusterRole: list and watch Nodes ([`super::cache`]), get a pod (the admission webhook); and
//! under `--agent-identity per-pod`, list and watch the agents' pods ([`super::agent_pods`]),
//! which the operator grants.

use std::path::{Path, PathBuf};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

#[derive(Debug, thiserror::Error)]
pub enum KubeApiError {
    #[error("--kubeconfig {path}: {detail}")]
    Kubeconfig { path: PathBuf, detail: String },
    #[error(
        "no --kubeconfig, and not in a cluster ({detail}): give --kubeconfig or run the webhook in a pod"
    )]
    InCluster { detail: String },
    #[error("the Kubernetes client cannot be built: {0}")]
    Client(String),
}

/// A client of the API server that `kubeconfig` names, or of the cluster the pod runs in.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeApiError> {
    let config = match kubeconfig {
        Some(path) => {
            let failed = |detail: String| KubeApiError::Kubeconfig {
                path: path.to_owned(),
                detail,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| failed(e.to_string()))?
        }
        None => Config::incluster().map_err(|e| KubeApiError::InCluster {
            detail: e.to_string(),
        })?,
    };
    Client::try_from(config).map_err(|e| KubeApiError::Client(e.to_string()))
}
