//! The manifests of `deploy/` as `kubectl kustomize` renders them (the base, or the base with
//! components), parsed into JSON values, and the agent's container read from the DaemonSet (and
//! the webhook's from its Deployment), so that tests check and run what the manifests say rather
//! than a copy of it.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Component, Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::peers::{validate_python, workspace};

/// Every document of one rendering.
pub struct Rendered {
    /// The YAML stream `kubectl kustomize` printed.
    pub yaml: String,
    pub documents: Vec<Value>,
}

/// Renders `deploy/` with `components` (names under `deploy/components/`), through an overlay in
/// a temporary directory when there are any (kustomize takes relative paths only).
pub fn render(components: &[&str]) -> Rendered {
    let deploy = workspace().join("deploy");
    let overlay = tempfile::Builder::new()
        .prefix("hugepage-agent-overlay-")
        .tempdir()
        .expect("a temporary overlay");
    let dir = if components.is_empty() {
        deploy.clone()
    } else {
        let from = overlay
            .path()
            .canonicalize()
            .expect("the overlay's real path");
        let deploy = deploy.canonicalize().expect("deploy/'s real path");
        let mut text = format!("resources:\n  - {}\n", relative(&from, &deploy).display());
        text.push_str("components:\n");
        for component in components {
            let path = relative(&from, &deploy.join("components").join(component));
            text.push_str(&format!("  - {}\n", path.display()));
        }
        std::fs::write(overlay.path().join("kustomization.yaml"), text).expect("the overlay");
        overlay.path().to_path_buf()
    };
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("run kubectl (kubectl kustomize renders deploy/)");
    assert!(
        out.status.success(),
        "kubectl kustomize {} with {components:?}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("kustomize prints UTF-8");
    let documents = yaml_documents(&yaml);
    Rendered { yaml, documents }
}

/// `to` as a path relative to the directory `from` (both absolute).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let shared = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in shared..from.len() {
        path.push("..");
    }
    for part in &to[shared..] {
        path.push(part);
    }
    path
}

/// A YAML stream as JSON values, by PyYAML (from the validator's venv): the same parser family
/// the tools that apply manifests use, and no YAML parser of our own.
pub fn yaml_documents(yaml: &str) -> Vec<Value> {
    let mut child = Command::new(validate_python())
        .args([
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d is not None], sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the validator venv's Python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("send the YAML");
    let out = child.wait_with_output().expect("PyYAML's answer");
    assert!(
        out.status.success(),
        "PyYAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from PyYAML")
}

impl Rendered {
    /// The one document of `kind` named `name`.
    pub fn find(&self, kind: &str, name: &str) -> &Value {
        let found: Vec<&Value> = self
            .documents
            .iter()
            .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .collect();
        assert_eq!(found.len(), 1, "{kind}/{name} in:\n{}", self.yaml);
        found[0]
    }

    /// `kind/name` of every document, in order.
    pub fn names(&self) -> Vec<String> {
        self.documents
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap_or("?"),
                    d["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }

    /// The agent's container and what its pod gives it.
    pub fn agent(&self) -> AgentPod {
        AgentPod::read(self.find("DaemonSet", "hugepage-agent"))
    }

    /// The webhook's container and what its pod gives it (component `webhook`), read as the
    /// agent's is.
    pub fn webhook(&self) -> AgentPod {
        AgentPod::read(self.find("Deployment", WEBHOOK))
    }

    /// Every document of `kind`.
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.documents
            .iter()
            .filter(|d| d["kind"] == kind)
            .collect()
    }
}

/// The name of the webhook's Deployment, Service, ServiceAccount and RBAC objects.
pub const WEBHOOK: &str = "hugepage-agent-webhook";

/// One volume mount of the agent's container, with the volume behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub name: String,
    pub path: String,
    pub read_only: bool,
    pub recursive_read_only: Option<String>,
    /// `mountPropagation`, where set.
    pub propagation: Option<String>,
    pub source: Source,
}

/// What a volume is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    HostPath { path: String, kind: String },
    Secret { name: String },
}

/// A workload's pod as far as its one container is concerned: the DaemonSet's (the agent) or the
/// webhook's Deployment's.
#[derive(Debug, Clone)]
pub struct AgentPod {
    pub pod: Value,
    pub container: Value,
    pub image: String,
    /// The container's arguments (the image's entrypoint runs them).
    pub args: Vec<String>,
    /// `add` of the container's capabilities, as Kubernetes names them (`BPF`); empty when none.
    pub capabilities: Vec<String>,
    pub drop: Vec<String>,
    pub run_as_user: u32,
    pub run_as_group: u32,
    pub mounts: Vec<Mount>,
    /// Named container ports.
    pub ports: BTreeMap<String, u16>,
}

impl AgentPod {
    fn read(workload: &Value) -> AgentPod {
        let pod = workload["spec"]["template"]["spec"].clone();
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "one container: {containers:#?}");
        let container = containers[0].clone();
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| s.as_str().expect("a string").to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let security = &container["securityContext"];
        let id = |field: &str| -> u32 {
            security[field]
                .as_u64()
                .or_else(|| pod["securityContext"][field].as_u64())
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or_else(|| panic!("{field} is declared"))
        };
        let volumes: BTreeMap<String, Source> = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .map(|v| {
                let name = v["name"].as_str().expect("a volume name").to_owned();
                let source = if v["hostPath"].is_object() {
                    Source::HostPath {
                        path: v["hostPath"]["path"].as_str().expect("a path").to_owned(),
                        kind: v["hostPath"]["type"].as_str().unwrap_or("").to_owned(),
                    }
                } else if v["secret"].is_object() {
                    Source::Secret {
                        name: v["secret"]["secretName"]
                            .as_str()
                            .expect("a secret name")
                            .to_owned(),
                    }
                } else {
                    panic!("a volume of a kind the agent's tests do not know: {v}")
                };
                (name, source)
            })
            .collect();
        let mounts = container["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .map(|m| {
                let name = m["name"].as_str().expect("a mount's volume").to_owned();
                Mount {
                    source: volumes
                        .get(&name)
                        .unwrap_or_else(|| panic!("no volume {name}"))
                        .clone(),
                    path: m["mountPath"].as_str().expect("a mountPath").to_owned(),
                    read_only: m["readOnly"].as_bool().unwrap_or(false),
                    recursive_read_only: m["recursiveReadOnly"].as_str().map(str::to_owned),
                    propagation: m["mountPropagation"].as_str().map(str::to_owned),
                    name,
                }
            })
            .collect();
        let ports = container["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().expect("a port name").to_owned(),
                    p["containerPort"]
                        .as_u64()
                        .and_then(|n| u16::try_from(n).ok())
                        .expect("a port"),
                )
            })
            .collect();
        AgentPod {
            image: container["image"].as_str().expect("an image").to_owned(),
            args: strings(&container["args"]),
            capabilities: strings(&security["capabilities"]["add"]),
            drop: strings(&security["capabilities"]["drop"]),
            run_as_user: id("runAsUser"),
            run_as_group: id("runAsGroup"),
            mounts,
            ports,
            pod,
            container,
        }
    }

    /// The value of `--flag=value` in the arguments.
    pub fn arg(&self, flag: &str) -> Option<&str> {
        let prefix = format!("{flag}=");
        self.args.iter().find_map(|a| a.strip_prefix(&prefix))
    }

    /// The port of a named container port.
    pub fn port(&self, name: &str) -> u16 {
        *self
            .ports
            .get(name)
            .unwrap_or_else(|| panic!("no container port {name}"))
    }

    /// The mount at `path`.
    pub fn mount(&self, path: &str) -> &Mount {
        self.mounts
            .iter()
            .find(|m| m.path == path)
            .unwrap_or_else(|| panic!("no volume mounted at {path}"))
    }
}

#[cfg(test)]
mod tests {
    use super::relative;
    use std::path::Path;

    #[test]
    fn relative_paths_climb_to_the_shared_prefix() {
        assert_eq!(
            relative(Path::new("/work/tmp/x"), Path::new("/work/repo/deploy")),
            Path::new("../../repo/deploy")
        );
        assert_eq!(relative(Path::new("/a"), Path::new("/a/b")), Path::new("b"));
    }
}
