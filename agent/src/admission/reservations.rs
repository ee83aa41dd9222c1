//! Reservations close KEP-5759's race window: between an admission and the moment the pod's
//! containers fault their hugepages, the pages still look free, and a second admission could be
//! granted the same pages. An admitted request with a pod UID therefore reserves its bytes per
//! size on its NUMA nodes; later admissions subtract every reservation of another pod whose nodes
//! meet theirs. A reservation ends when the pod's cgroup has faulted its pages, when the pod's
//! cgroup is removed, when its TTL passes, or by `DELETE /v1/reservations/{id}`.
//!
//! The set survives restarts: every change is written to `<state-dir>/reservations.json` as a
//! temporary file, fsynced and renamed over the old one, with a checksum (FNV-1a 64 of the
//! reservations' JSON) as the kubelet's checkpoints have. A file that does not parse or whose
//! checksum does not match is renamed aside (`.corrupt-<unix time>`) and reported, never half-read.
//! A reservation whose pod UID, namespace or name the API would refuse ([`identifiers`]: a file
//! written by an older agent, which took any text) is not loaded: the file is renamed aside
//! (`.refused-<unix time>`), the others are written anew, and each refused one is reported.
//!
//! A change is made in memory under the caller's lock and returns a [`Snapshot`] of the file's
//! content, which the caller writes ([`Snapshot::write`]) after releasing the lock (an admission
//! answers only once its snapshot is written). So a slow disk never holds the lock, and the API
//! thread never waits for an fsync: the handler hands the write to a blocking thread. Snapshots
//! carry the store's generation, and one older than what the file holds is skipped: the file
//! already has every change up to its own.

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::verify::{REASON, ReservationRef, Verdict, message};
use crate::{
    host::{NumaNode, PageSize},
    kube::identifiers::{self, IdentifierError},
};

const FILE: &str = "reservations.json";
const VERSION: u32 = 1;
/// Refused reservations a warning names one by one.
const REFUSED_SHOWN: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub id: String,
    pub pod_uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    pub numa_nodes: Vec<NumaNode>,
    /// Page size in bytes → bytes reserved.
    pub bytes: BTreeMap<PageSize, u64>,
    #[serde(with = "unix_millis")]
    pub created_at: SystemTime,
    #[serde(with = "unix_millis")]
    pub expires_at: SystemTime,
}

mod unix_millis {
    use std::time::{Duration, SystemTime};

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let ms = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        s.serialize_u64(ms)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        Ok(SystemTime::UNIX_EPOCH + Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Why a reservation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    Faulted,
    PodRemoved,
    Expired,
    Deleted,
}

/// The file's shape.
#[derive(Debug, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    reservations: Vec<Reservation>,
    checksum: String,
}

/// The reservations, in memory; each change returns the [`Snapshot`] that writes their file.
#[derive(Debug)]
pub struct Store {
    writer: Arc<Writer>,
    ttl: Duration,
    entries: BTreeMap<String, Reservation>,
    next: u64,
    /// Changes made so far; each [`Snapshot`] carries the count it was taken at.
    generation: u64,
    /// Woken after each change (one permit kept when nobody waits): for the watch's hub.
    changed: Arc<Notify>,
    /// What one namespace may hold reserved (`--namespace-reservation-limit`).
    namespace_limit: NamespaceLimit,
}

/// `--namespace-reservation-limit`: the bytes of one page size a namespace's reservations may
/// hold at once on the node, as bytes or as a percentage of the node's pool of that size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceLimit {
    Bytes(u64),
    /// 1 to 100.
    Percent(u64),
}

impl NamespaceLimit {
    /// The limit for a size whose pool on the node is `pool` bytes.
    pub fn of(self, pool: u64) -> u64 {
        match self {
            NamespaceLimit::Bytes(bytes) => bytes,
            NamespaceLimit::Percent(p) => (u128::from(pool) * u128::from(p) / 100) as u64,
        }
    }
}

/// The file's content at one generation of the store, and the file.
#[derive(Debug)]
pub struct Snapshot {
    generation: u64,
    text: Vec<u8>,
    writer: Arc<Writer>,
}

/// The store's file: written one snapshot at a time.
#[derive(Debug)]
struct Writer {
    path: PathBuf,
    /// The generation the file holds.
    written: Mutex<u64>,
}

/// FNV-1a, 64 bits, as hex.
fn checksum(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

impl Store {
    /// [`Store::open`] as the agent starts: a file set aside is warned about, and what was
    /// restored is logged.
    pub fn restore(dir: &Path, ttl: Duration) -> Result<Store, ReservationError> {
        let (store, set_aside) = Store::open(dir, ttl)?;
        if let Some(warning) = set_aside {
            tracing::warn!("{warning}");
        }
        tracing::info!(restored = store.entries.len(), dir = %dir.display(), "reservations loaded");
        Ok(store)
    }

    /// Loads `<dir>/reservations.json` (creating `dir`); a corrupt file is set aside and named in
    /// the returned warning.
    pub fn open(dir: &Path, ttl: Duration) -> Result<(Store, Option<String>), ReservationError> {
        fs::create_dir_all(dir).map_err(|source| ReservationError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE);
        // A write killed before its rename leaves its temporary file; the file it was to replace
        // is whole. It is never read, and the next write would truncate it: removed now so that
        // it holds no space meanwhile (if it cannot be, nothing depends on it).
        let _ = fs::remove_file(temporary(&path));
        let mut store = Store {
            writer: Arc::new(Writer {
                path: path.clone(),
                written: Mutex::new(0),
            }),
            ttl,
            entries: BTreeMap::new(),
            next: 0,
            generation: 0,
            changed: Arc::new(Notify::new()),
            namespace_limit: NamespaceLimit::Percent(100),
        };
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((store, None)),
            Err(source) => return Err(ReservationError::Io { path, source }),
        };
        let list = match parse(&text) {
            Ok(list) => list,
            Err(why) => {
                let aside = set_aside(&path, "corrupt")?;
                return Ok((
                    store,
                    Some(format!(
                        "{}: {why}; set aside as {} and starting with no reservations",
                        path.display(),
                        aside.display()
                    )),
                ));
            }
        };
        let mut refused = Vec::new();
        for r in list {
            match check_identifiers(&r) {
                Ok(()) => {
                    store.entries.insert(r.id.clone(), r);
                }
                Err(why) => refused.push(format!("{}: {why}", identifiers::Shown::new(&r.id))),
            }
        }
        if refused.is_empty() {
            return Ok((store, None));
        }
        let aside = set_aside(&path, "refused")?;
        store.snapshot().write()?;
        let kept = store.entries.len();
        let shown = refused.len().min(REFUSED_SHOWN);
        let more = match refused.len() - shown {
            0 => String::new(),
            n => format!("; and {n} more"),
        };
        Ok((
            store,
            Some(format!(
                "{}: {} reservation(s) refused, their pod is not named as Kubernetes names pods (reservation {}{more}); the file is set aside as {} and the {} others kept",
                path.display(),
                refused.len(),
                refused[..shown].join("; reservation "),
                aside.display(),
                kept
            )),
        ))
    }

    /// Woken after each change of the reservations.
    pub fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.changed)
    }

    pub fn list(&self) -> Vec<Reservation> {
        self.entries.values().cloned().collect()
    }

    /// Bytes of `size` reserved for pods other than `pod_uid` on nodes that meet `nodes`, by
    /// reservations still in force at `now` (an expired one holds nothing even before the run
    /// loop removes it, so admission never has to write the file to expire one).
    pub fn held(&self, size: PageSize, nodes: &[NumaNode], pod_uid: &str, now: SystemTime) -> u64 {
        held_by(
            self.entries.values().filter(|r| r.expires_at > now),
            size,
            nodes,
            pod_uid,
        )
    }

    /// The reservations in force at `now`.
    pub fn in_force(&self, now: SystemTime) -> impl Iterator<Item = &Reservation> {
        self.entries.values().filter(move |r| r.expires_at > now)
    }

    /// Limits what one namespace may hold reserved to `limit`.
    pub fn limit_namespaces(mut self, limit: NamespaceLimit) -> Store {
        self.namespace_limit = limit;
        self
    }

    /// Why reserving what `verdict` admitted for pod `pod_uid` of `namespace` at `now` would
    /// take the namespace past its limit, if it would ([`over_namespace_limit`]); `pool` is the
    /// node's pool of a size, in bytes.
    pub fn over_namespace_limit(
        &self,
        verdict: &Verdict,
        namespace: &str,
        pod_uid: &str,
        pool: impl Fn(PageSize) -> u64,
        now: SystemTime,
    ) -> Option<String> {
        over_namespace_limit(self.in_force(now), verdict, namespace, pod_uid, |size| {
            self.namespace_limit.of(pool(size))
        })
    }

    /// A reservation held for `pod_uid` under another namespace or name than
    /// `namespace/name`, if any ([`other_owner`]).
    pub fn other_owner(&self, pod_uid: &str, namespace: &str, name: &str) -> Option<&Reservation> {
        other_owner(self.entries.values(), pod_uid, namespace, name)
    }

    /// Reserves what `verdict` admitted for `pod_uid`, replacing that pod's earlier reservation;
    /// the reservations it replaced (for [`Store::take_back`]) and the snapshot to write before
    /// the admission is answered.
    pub fn reserve(
        &mut self,
        verdict: &Verdict,
        pod_uid: &str,
        namespace: &str,
        name: &str,
        now: SystemTime,
    ) -> (ReservationRef, Vec<Reservation>, Snapshot) {
        self.next += 1;
        let id = format!(
            "{}-{}",
            now.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
            self.next
        );
        let reservation = Reservation {
            id: id.clone(),
            pod_uid: pod_uid.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            numa_nodes: verdict.numa_nodes.clone(),
            bytes: verdict
                .checks
                .iter()
                .map(|c| (c.page_size, c.requested_bytes))
                .collect(),
            created_at: now,
            expires_at: now + self.ttl,
        };
        let replaced: Vec<String> = self
            .entries
            .values()
            .filter(|r| r.pod_uid == pod_uid)
            .map(|r| r.id.clone())
            .collect();
        let replaced = replaced
            .iter()
            .filter_map(|old| self.entries.remove(old))
            .collect();
        self.entries.insert(id.clone(), reservation);
        let made = ReservationRef {
            id,
            expires_at: now + self.ttl,
        };
        (made, replaced, self.snapshot())
    }

    /// Takes back reservation `id` (its snapshot could not be written, so the admission that
    /// made it failed) and puts back the reservations it `replaced`, which the file still
    /// holds: a failed admission leaves the pod's earlier reservation as it was. The snapshot
    /// to write, if `id` was there; if it is gone (a later admission of the pod replaced it, or
    /// it ended), nothing changes.
    pub fn take_back(&mut self, id: &str, replaced: Vec<Reservation>) -> Option<Snapshot> {
        self.entries.remove(id)?;
        for earlier in replaced {
            self.entries.insert(earlier.id.clone(), earlier);
        }
        Some(self.snapshot())
    }

    /// Removes the reservations `pick` gives a reason for and returns them with it, and the
    /// snapshot to write when there were any.
    pub fn release<R>(
        &mut self,
        mut pick: impl FnMut(&Reservation) -> Option<R>,
    ) -> (Vec<(Reservation, R)>, Option<Snapshot>) {
        let gone: Vec<(Reservation, R)> = self
            .entries
            .values()
            .filter_map(|r| pick(r).map(|why| (r.clone(), why)))
            .collect();
        if gone.is_empty() {
            return (gone, None);
        }
        for (r, _) in &gone {
            self.entries.remove(&r.id);
        }
        let snapshot = self.snapshot();
        (gone, Some(snapshot))
    }

    /// The file's content now, as the next generation.
    fn snapshot(&mut self) -> Snapshot {
        self.generation += 1;
        self.changed.notify_one();
        let reservations: Vec<&Reservation> = self.entries.values().collect();
        let text = file_text(&reservations);
        Snapshot {
            generation: self.generation,
            text,
            writer: Arc::clone(&self.writer),
        }
    }
}

impl Snapshot {
    /// Writes the file atomically (temporary file, fsync, rename, fsync of the directory),
    /// unless it already holds this snapshot or a later one.
    pub fn write(self) -> Result<(), ReservationError> {
        let writer = &self.writer;
        // A poisoned lock only means an earlier write panicked; the generation is still right.
        let mut written = writer.written.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation <= *written {
            return Ok(());
        }
        writer.replace(&self.text)?;
        *written = self.generation;
        Ok(())
    }
}

impl Writer {
    /// A write that fails (a full or read-only state directory) leaves the file as it was and
    /// removes its temporary file.
    fn replace(&self, text: &[u8]) -> Result<(), ReservationError> {
        let tmp = temporary(&self.path);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReservationError::Io { path, source }
        };
        let renamed = fs::File::create(&tmp)
            .and_then(|mut f| {
                f.write_all(text)?;
                f.sync_all()
            })
            .map_err(io(&tmp))
            .and_then(|()| fs::rename(&tmp, &self.path).map_err(io(&self.path)));
        if renamed.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        renamed?;
        if let Some(dir) = self.path.parent() {
            fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io(dir))?;
        }
        Ok(())
    }
}

/// The temporary file a write of `path` goes through before its rename.
fn temporary(path: &Path) -> PathBuf {
    path.with_extension("json.tmp")
}

/// Renames the file `path` aside as `<path>.<why>-<unix time>`; the new name.
fn set_aside(path: &Path, why: &str) -> Result<PathBuf, ReservationError> {
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let aside = path.with_extension(format!("json.{why}-{stamp}"));
    fs::rename(path, &aside).map_err(|source| ReservationError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(aside)
}

/// The file's content holding `reservations`, with their checksum.
pub fn file_text(reservations: &[&Reservation]) -> Vec<u8> {
    let data = serde_json::to_vec(reservations).unwrap_or_default();
    serde_json::to_vec_pretty(&serde_json::json!({
        "version": VERSION,
        "reservations": reservations,
        "checksum": checksum(&data),
    }))
    .unwrap_or_default()
}

/// A stored reservation's pod, checked as an admission checks it: a UID (every reservation has
/// one), and a namespace and name when given; why not, naming the field.
pub fn check_identifiers(r: &Reservation) -> Result<(), String> {
    fn named(field: &'static str) -> impl Fn(IdentifierError) -> String {
        move |e| format!("{field} {e}")
    }
    identifiers::pod_uid(&r.pod_uid).map_err(named("podUid"))?;
    if !r.namespace.is_empty() {
        identifiers::namespace(&r.namespace).map_err(named("namespace"))?;
    }
    if !r.name.is_empty() {
        identifiers::pod_name(&r.name).map_err(named("name"))?;
    }
    Ok(())
}

/// The reservations of a file's content, or why the file is refused (its checksum included).
pub fn parse(text: &[u8]) -> Result<Vec<Reservation>, String> {
    let checkpoint: Checkpoint =
        serde_json::from_slice(text).map_err(|e| format!("not a reservations file: {e}"))?;
    if checkpoint.version != VERSION {
        return Err(format!(
            "version {} is not {VERSION} (written by another agent version)",
            checkpoint.version
        ));
    }
    let data = serde_json::to_vec(&checkpoint.reservations).unwrap_or_default();
    let expected = checksum(&data);
    if expected != checkpoint.checksum {
        return Err(format!(
            "checksum {} does not match the content ({expected}): the file is corrupt",
            checkpoint.checksum
        ));
    }
    Ok(checkpoint.reservations)
}

/// Why reserving what `verdict` admitted for pod `pod_uid` of `namespace` would take the
/// namespace's reservations of a size in `reservations` (the pod's own left out: it is
/// replaced) past `limit` of that size; none when it would not.
pub fn over_namespace_limit<'a>(
    reservations: impl IntoIterator<Item = &'a Reservation>,
    verdict: &Verdict,
    namespace: &str,
    pod_uid: &str,
    limit: impl Fn(PageSize) -> u64,
) -> Option<String> {
    let mut held: BTreeMap<PageSize, u64> = BTreeMap::new();
    for r in reservations {
        if r.namespace == namespace && r.pod_uid != pod_uid {
            for (size, bytes) in &r.bytes {
                *held.entry(*size).or_default() += bytes;
            }
        }
    }
    verdict.checks.iter().find_map(|c| {
        let already = held.get(&c.page_size).copied().unwrap_or(0);
        let most = limit(c.page_size);
        (already.saturating_add(c.requested_bytes) > most).then(|| {
            format!(
                "namespace {namespace} would hold {} bytes of {} reserved on this node, over its --namespace-reservation-limit of {most} ({already} reserved for its other pods, {} requested)",
                already.saturating_add(c.requested_bytes),
                c.resource,
                c.requested_bytes
            )
        })
    })
}

/// The first of `reservations` held for `pod_uid` under another namespace or name than
/// `namespace/name`: a UID names one pod, so a request naming it under another name is not
/// that pod's, and never replaces its reservation.
pub fn other_owner<'a>(
    reservations: impl IntoIterator<Item = &'a Reservation>,
    pod_uid: &str,
    namespace: &str,
    name: &str,
) -> Option<&'a Reservation> {
    reservations
        .into_iter()
        .find(|r| r.pod_uid == pod_uid && (r.namespace != namespace || r.name != name))
}

/// Bytes of `size` that `reservations` hold for pods other than `pod_uid` on nodes that meet
/// `nodes`: a reservation may draw from any of its nodes, so one that meets them counts whole,
/// once. The agent's store and the webhook's streamed copy of it count the same way.
pub fn held_by<'a>(
    reservations: impl IntoIterator<Item = &'a Reservation>,
    size: PageSize,
    nodes: &[NumaNode],
    pod_uid: &str,
) -> u64 {
    reservations
        .into_iter()
        .filter(|r| r.pod_uid != pod_uid && r.numa_nodes.iter().any(|n| nodes.contains(n)))
        .filter_map(|r| r.bytes.get(&size))
        .sum()
}

/// Subtracts other pods' reservations in force at `now` from each verified check of `verdict`
/// (admission of `pod_uid`), rejecting with the KEP's message on what is left.
pub fn apply(verdict: &mut Verdict, store: &Store, pod_uid: &str, now: SystemTime) {
    subtract(verdict, |size, nodes| store.held(size, nodes, pod_uid, now));
}

/// Subtracts what `held` says other pods' reservations hold of each size on each verified
/// check's nodes, rejecting with the KEP's message on what is left.
pub fn subtract(verdict: &mut Verdict, held: impl Fn(PageSize, &[NumaNode]) -> u64) {
    for check in verdict.checks.iter_mut().filter(|c| c.unverified.is_none()) {
        let held = held(check.page_size, &check.numa_nodes);
        if held == 0 {
            continue;
        }
        check.reserved_by_agent_bytes = held;
        check.available_bytes = check.available_bytes.saturating_sub(held);
        check.ok = check.available_bytes >= check.requested_bytes;
        if !check.ok && verdict.allowed {
            verdict.allowed = false;
            verdict.reason = Some(REASON);
            verdict.message = Some(message(check));
        }
    }
}

#[cfg(test)]
mod tests;
