//! **A stand-in for kube-apiserver**, the one stand-in of the webhook's tests: no API server can
//! be installed on these machines. It serves, over HTTPS with a CA of its own and a bearer
//! token, the few calls the webhook makes, in the API server's wire format:
//!
//! * `GET /api/v1/nodes`: a `NodeList` (`kind`, `apiVersion`, `metadata.resourceVersion`, the
//!   items without `kind`/`apiVersion`, as the API server writes a typed list);
//! * `GET /api/v1/nodes?watch=true&resourceVersion=N…`: a chunked stream of watch events, one
//!   JSON object per line (`{"type":"ADDED"|"MODIFIED"|"DELETED","object":{…}}`), every event
//!   after `N` first and then each change as it happens, with a `BOOKMARK` each second when
//!   `allowWatchBookmarks=true`; a resumed watch from before what it kept is answered as the API
//!   server does, with an `ERROR` event whose `Status` is `410` `Expired`;
//! * `GET /api/v1/namespaces/NS/pods/NAME`: the pod, or a `404` `Status`;
//! * `GET /api/v1/namespaces/NS/pods?labelSelector=…`: a `PodList` of that namespace's pods
//!   whose labels match every `key=value` of the selector, and with `watch=true` a watch of
//!   them as of Nodes (pods' events kept apart from Nodes');
//! * `GET /version`: a `version.Info` of a v1.35 API server;
//! * `GET` of any other object's path given to [`StandInApiServer::put_object`] (a Service, a
//!   ValidatingWebhookConfiguration), or a `404` `Status`; a path given to
//!   [`StandInApiServer::forbid`] is answered `403` as RBAC answers a caller it does not allow.
//!
//! The test drives it: Nodes added, changed and deleted ([`StandInApiServer::put_node`],
//! [`StandInApiServer::delete_node`]), pods likewise ([`StandInApiServer::put_pod`],
//! [`StandInApiServer::delete_pod`]), open watches ended ([`StandInApiServer::end_watches`]),
//! history dropped so the next resumed watch is told `410` ([`StandInApiServer::compact`]), or
//! watches answered `410 Gone` outright until the next list ([`StandInApiServer::gone_until_listed`]), lists
//! held unanswered ([`StandInApiServer::hold_lists`]); every
//! request is recorded ([`StandInApiServer::requests`]). Threads and sockets are stopped and
//! joined when it is dropped.

use std::{
    collections::BTreeMap,
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use rustls::{ServerConfig, ServerConnection, StreamOwned};
use rustls_pki_types::{PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};

use crate::mtls::Ca;

/// The bearer token the stand-in requires.
const TOKEN: &str = "stand-in-token-0123456789";
/// How often an open watch sends a bookmark.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    /// The last resourceVersion given out.
    rv: u64,
    nodes: BTreeMap<String, Value>,
    /// `(resourceVersion, type, object)` of every change kept.
    events: Vec<(u64, &'static str, Value)>,
    /// A watch from a resourceVersion below this one is told 410 (its history is gone).
    oldest: u64,
    pods: BTreeMap<(String, String), Value>,
    /// `(resourceVersion, type, pod)` of every change of a pod kept.
    pod_events: Vec<(u64, &'static str, Value)>,
    /// Other objects by their API path.
    objects: BTreeMap<String, Value>,
    /// Paths answered 403.
    forbidden: Vec<String>,
    /// Bumped to end every open watch.
    generation: u64,
    gone_until_listed: bool,
    /// Lists wait while this holds.
    hold_lists: bool,
    requests: Vec<String>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The stand-in API server (see the module's documentation).
pub struct StandInApiServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    ca: Ca,
    thread: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl StandInApiServer {
    /// Listens on `127.0.0.1` on a free port.
    pub fn start() -> StandInApiServer {
        let ca = Ca::new("stand-in kube-apiserver CA");
        let pair = ca.server_named("kube-apiserver", "127.0.0.1");
        let key = PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).expect("the key PEM");
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_no_client_auth()
                .with_single_cert(vec![pair.der()], key)
                .expect("a server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stand-in API server");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (s, conns) = (shared.clone(), connections.clone());
        let thread = std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let (s, config) = (s.clone(), config.clone());
                let handle = std::thread::spawn(move || serve(&s, config, tcp));
                conns.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
            }
        });
        StandInApiServer {
            addr,
            shared,
            ca,
            thread: Some(thread),
            connections,
        }
    }

    /// Writes a kubeconfig for the stand-in (its CA, its URL, the token) into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let ca = dir.join("apiserver-ca.crt");
        std::fs::write(&ca, &self.ca.pem).expect("write the API server's CA");
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: https://{}\n    certificate-authority: {}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: webhook\ncurrent-context: stand-in\nusers:\n- name: webhook\n  user:\n    token: {TOKEN}\n",
            self.addr,
            ca.display()
        );
        std::fs::write(&path, text).expect("write the kubeconfig");
        path
    }

    /// Adds `node`, or replaces the Node of its name (an `ADDED` or `MODIFIED` event).
    pub fn put_node(&self, mut node: Value) {
        let mut state = self.shared.lock();
        state.rv += 1;
        let rv = state.rv;
        node["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = node["metadata"]["name"]
            .as_str()
            .expect("a Node with a name")
            .to_owned();
        let kind = if state.nodes.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.nodes.insert(name, node.clone());
        state.events.push((rv, kind, node));
        self.shared.changed.notify_all();
    }

    /// Deletes the Node `name` (a `DELETED` event).
    pub fn delete_node(&self, name: &str) {
        let mut state = self.shared.lock();
        let Some(mut node) = state.nodes.remove(name) else {
            return;
        };
        state.rv += 1;
        let rv = state.rv;
        node["metadata"]["resourceVersion"] = json!(rv.to_string());
        state.events.push((rv, "DELETED", node));
        self.shared.changed.notify_all();
    }

    /// Adds or replaces a pod (an `ADDED` or `MODIFIED` event).
    pub fn put_pod(&self, mut pod: Value) {
        let mut state = self.shared.lock();
        state.rv += 1;
        let rv = state.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (
            pod["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            pod["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        );
        let kind = if state.pods.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.pods.insert(key, pod.clone());
        state.pod_events.push((rv, kind, pod));
        self.shared.changed.notify_all();
    }

    /// Deletes the pod `namespace`/`name` (a `DELETED` event).
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut state = self.shared.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let Some(mut pod) = state.pods.remove(&key) else {
            return;
        };
        state.rv += 1;
        let rv = state.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        state.pod_events.push((rv, "DELETED", pod));
        self.shared.changed.notify_all();
    }

    /// Serves `object` at `path` (`/api/v1/namespaces/NS/services/NAME`, …) from now on.
    pub fn put_object(&self, path: &str, object: Value) {
        let mut state = self.shared.lock();
        state.rv += 1;
        let mut object = object;
        object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        state.objects.insert(path.to_owned(), object);
    }

    /// Answers `GET path` with RBAC's `403` (`forbid = true`) or as before.
    pub fn forbid(&self, path: &str, forbid: bool) {
        let mut state = self.shared.lock();
        state.forbidden.retain(|p| p != path);
        if forbid {
            state.forbidden.push(path.to_owned());
        }
    }

    /// Ends every open watch stream (cleanly: the last chunk is sent).
    pub fn end_watches(&self) {
        self.shared.lock().generation += 1;
        self.shared.changed.notify_all();
    }

    /// Forgets the history: a watch resumed from any resourceVersion given out so far is told
    /// `410 Expired` in an `ERROR` event.
    pub fn compact(&self) {
        let mut state = self.shared.lock();
        state.oldest = state.rv + 1;
        state.events.clear();
        state.pod_events.clear();
    }

    /// Answers every watch request with HTTP `410 Gone` until Nodes are listed again.
    pub fn gone_until_listed(&self) {
        self.shared.lock().gone_until_listed = true;
    }

    /// While `hold` is true, lists of Nodes are not answered (they wait).
    pub fn hold_lists(&self, hold: bool) {
        self.shared.lock().hold_lists = hold;
        self.shared.changed.notify_all();
    }

    /// Every request so far: `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// Waits until a request for which `matches` holds has come, up to `timeout`.
    pub fn wait_for_request(&self, timeout: Duration, matches: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if state.requests.iter().any(|r| matches(r)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for StandInApiServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let handles =
            std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in handles {
            let _ = handle.join();
        }
    }
}

type Stream = StreamOwned<ServerConnection, TcpStream>;

/// Serves one connection's requests, one after the other, until it closes or the stand-in stops.
fn serve(shared: &Shared, config: Arc<ServerConfig>, tcp: TcpStream) {
    if tcp
        .set_read_timeout(Some(Duration::from_millis(200)))
        .is_err()
    {
        return;
    }
    let Ok(connection) = ServerConnection::new(config) else {
        return;
    };
    let mut stream = StreamOwned::new(connection, tcp);
    let mut buffer = Vec::new();
    while let Some(head) = read_head(shared, &mut stream, &mut buffer) {
        let mut lines = head.lines();
        let request_line = lines.next().unwrap_or_default().to_owned();
        let authorized = lines.any(|l| {
            l.to_ascii_lowercase().starts_with("authorization:")
                && l.trim_end().ends_with(&format!("Bearer {TOKEN}"))
        });
        let mut parts = request_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        shared.lock().requests.push(format!("{method} {target}"));
        shared.changed.notify_all();
        let result = if !authorized {
            respond(
                &mut stream,
                401,
                &status(401, "Unauthorized", "Unauthorized"),
            )
        } else {
            route(shared, &mut stream, method, target)
        };
        if result.is_err() {
            return;
        }
    }
}

/// Reads one request's head (a GET has no body), waiting while the connection is idle.
fn read_head(shared: &Shared, stream: &mut Stream, buffer: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            buffer.drain(..end + 4);
            return Some(head);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if shared.stop.load(Ordering::SeqCst) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

fn route(shared: &Shared, stream: &mut Stream, method: &str, target: &str) -> io::Result<()> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let params: BTreeMap<&str, &str> = query.split('&').filter_map(|p| p.split_once('=')).collect();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("GET", ["api", "v1", "nodes"]) if matches!(params.get("watch"), Some(&"true" | &"1")) => {
            watch(shared, stream, &params, &Watched::Nodes)
        }
        ("GET", ["api", "v1", "namespaces", namespace, "pods"]) => {
            let watched = Watched::Pods {
                namespace: (*namespace).to_owned(),
                selector: selector(params.get("labelSelector").copied().unwrap_or("")),
            };
            if matches!(params.get("watch"), Some(&"true" | &"1")) {
                return watch(shared, stream, &params, &watched);
            }
            let state = shared.lock();
            let list = list(&state, "PodList", state.pods.values(), &watched);
            drop(state);
            respond(stream, 200, &list)
        }
        ("GET", ["api", "v1", "nodes"]) => {
            let mut state = shared.lock();
            while state.hold_lists && !shared.stop.load(Ordering::SeqCst) {
                state = shared
                    .changed
                    .wait_timeout(state, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            state.gone_until_listed = false;
            let list = list(&state, "NodeList", state.nodes.values(), &Watched::Nodes);
            drop(state);
            respond(stream, 200, &list)
        }
        ("GET", ["api", "v1", "namespaces", namespace, "pods", name]) => {
            let pod = shared
                .lock()
                .pods
                .get(&((*namespace).to_owned(), (*name).to_owned()))
                .cloned();
            match pod {
                Some(mut pod) => {
                    pod["kind"] = json!("Pod");
                    pod["apiVersion"] = json!("v1");
                    respond(stream, 200, &pod)
                }
                None => {
                    let mut body = status(404, "NotFound", &format!("pods \"{name}\" not found"));
                    body["details"] = json!({"name": name, "kind": "pods"});
                    respond(stream, 404, &body)
                }
            }
        }
        ("GET", ["version"]) => respond(
            stream,
            200,
            &json!({
                "major": "1", "minor": "35", "gitVersion": "v1.35.0",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-11-01T00:00:00Z", "goVersion": "go1.25.0",
                "compiler": "gc", "platform": "linux/amd64"
            }),
        ),
        ("GET", _) if shared.lock().forbidden.iter().any(|p| p == path) => {
            let message = format!(
                "User \"system:serviceaccount:hugepage-agent:hugepage-agent-webhook\" cannot get path \"{path}\""
            );
            respond(stream, 403, &status(403, "Forbidden", &message))
        }
        ("GET", _) => {
            let object = shared.lock().objects.get(path).cloned();
            match object {
                Some(object) => respond(stream, 200, &object),
                None => {
                    let message = match segments.as_slice() {
                        [.., kind, name] => format!("{kind} \"{name}\" not found"),
                        _ => "the server could not find the requested resource".to_owned(),
                    };
                    respond(stream, 404, &status(404, "NotFound", &message))
                }
            }
        }
        _ => respond(
            stream,
            404,
            &status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        ),
    }
}

/// What a list or watch shows: every Node, or the pods of a namespace that a selector selects.
enum Watched {
    Nodes,
    Pods {
        namespace: String,
        selector: Vec<(String, String)>,
    },
}

impl Watched {
    /// The kept events of what is watched.
    fn events<'a>(&self, state: &'a State) -> &'a [(u64, &'static str, Value)] {
        match self {
            Watched::Nodes => &state.events,
            Watched::Pods { .. } => &state.pod_events,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Watched::Nodes => "Node",
            Watched::Pods { .. } => "Pod",
        }
    }

    /// Whether `object` is shown.
    fn shows(&self, object: &Value) -> bool {
        match self {
            Watched::Nodes => true,
            Watched::Pods {
                namespace,
                selector,
            } => {
                object["metadata"]["namespace"].as_str() == Some(namespace.as_str())
                    && selector.iter().all(|(key, value)| {
                        object["metadata"]["labels"][key].as_str() == Some(value.as_str())
                    })
            }
        }
    }
}

/// A typed list of `kind` of the `objects` that `watched` shows, at the state's resourceVersion
/// (the items without `kind`/`apiVersion`, as the API server writes them).
fn list<'a>(
    state: &State,
    kind: &str,
    objects: impl Iterator<Item = &'a Value>,
    watched: &Watched,
) -> Value {
    let items: Vec<Value> = objects
        .filter(|object| watched.shows(object))
        .map(|object| {
            let mut item = object.clone();
            if let Some(o) = item.as_object_mut() {
                o.remove("kind");
                o.remove("apiVersion");
            }
            item
        })
        .collect();
    json!({
        "kind": kind,
        "apiVersion": "v1",
        "metadata": {"resourceVersion": state.rv.to_string()},
        "items": items,
    })
}

/// A `labelSelector` of `key=value` pairs, percent-decoded.
fn selector(encoded: &str) -> Vec<(String, String)> {
    let bytes = encoded.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (b'+', _) => {
                decoded.push(b' ');
                i += 1;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded)
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A watch of `watched` from `resourceVersion`, until ended, timed out or the stand-in stops.
fn watch(
    shared: &Shared,
    stream: &mut Stream,
    params: &BTreeMap<&str, &str>,
    watched: &Watched,
) -> io::Result<()> {
    let from: u64 = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = params.get("allowWatchBookmarks") == Some(&"true");
    let until = Instant::now()
        + Duration::from_secs(
            params
                .get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        );
    let mut state = shared.lock();
    if state.gone_until_listed {
        drop(state);
        let message = format!("too old resource version: {from}");
        return respond(stream, 410, &status(410, "Gone", &message));
    }
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n\r\n",
    )?;
    if from < state.oldest {
        let message = format!("too old resource version: {from} ({})", state.oldest);
        let event = json!({"type": "ERROR", "object": status(410, "Expired", &message)});
        drop(state);
        chunk(stream, &event)?;
        return stream.write_all(b"0\r\n\r\n").and_then(|()| stream.flush());
    }
    let generation = state.generation;
    let mut sent = from;
    let mut bookmark_at = Instant::now() + BOOKMARK_EVERY;
    loop {
        if state.generation != generation || shared.stop.load(Ordering::SeqCst) {
            drop(state);
            return stream.write_all(b"0\r\n\r\n").and_then(|()| stream.flush());
        }
        let events = watched.events(&state);
        let pending: Vec<Value> = events
            .iter()
            .filter(|(rv, _, object)| *rv > sent && watched.shows(object))
            .map(|(_, kind, object)| {
                let mut object = object.clone();
                object["kind"] = json!(watched.kind());
                object["apiVersion"] = json!("v1");
                json!({"type": kind, "object": object})
            })
            .collect();
        sent = sent.max(events.last().map_or(sent, |(rv, _, _)| *rv));
        let current = state.rv;
        drop(state);
        for event in &pending {
            chunk(stream, event)?;
        }
        if Instant::now() >= until {
            return stream.write_all(b"0\r\n\r\n").and_then(|()| stream.flush());
        }
        if bookmarks && Instant::now() >= bookmark_at {
            let event = json!({"type": "BOOKMARK", "object": {"kind": watched.kind(), "apiVersion": "v1", "metadata": {"resourceVersion": current.to_string(), "creationTimestamp": null}}});
            chunk(stream, &event)?;
            bookmark_at = Instant::now() + BOOKMARK_EVERY;
        }
        state = shared.lock();
        if watched
            .events(&state)
            .last()
            .is_none_or(|(rv, _, _)| *rv <= sent)
            && state.generation == generation
        {
            state = shared
                .changed
                .wait_timeout(state, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One watch event, as one chunk ending in a newline.
fn chunk(stream: &mut Stream, event: &Value) -> io::Result<()> {
    let line = format!("{event}\n");
    write!(stream, "{:x}\r\n{line}\r\n", line.len())?;
    stream.flush()
}

/// A `metav1.Status` of failure.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(stream: &mut Stream, code: u16, body: &Value) -> io::Result<()> {
    let text = body.to_string();
    let phrase = match code {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        410 => "Gone",
        _ => "Error",
    };
    write!(
        stream,
        "HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}
