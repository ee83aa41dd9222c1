//! When reservations end: the pod's cgroup is charged with the reserved bytes (its containers
//! have faulted their pages), the pod's cgroup is gone, or the reservation expired. This module
//! owns where each pod's cgroup is (kept from cgroup events and replaced by each rescan) and
//! decides; the store writes the file once per release, outside its lock, so admissions do not
//! wait for the disk.
//!
//! Where this stops: finding the pod cgroups on a rescan is the caller's walk (it feeds the
//! probe's watch set too); what a release means for the metrics is the caller's as well.

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use tracing::{debug, info, warn};

use super::reservations::{Released, Reservation, Store};
use crate::{
    host::PageSize,
    kubelet::{cgroup_path::Owner, pods::PodCgroups},
    sysfs::{HostFs, hugetlb_cgroup},
};

/// Ends reservations as their pods fault, go or expire.
pub struct Releaser {
    host: HostFs,
    /// Where each pod's cgroup is, to see a reserved pod fault its pages or go.
    pods: PodCgroups,
    reservations: Arc<Mutex<Store>>,
}

/// Every reservation ended by one call, with why.
pub type Ended = Vec<(Reservation, Released)>;

impl Releaser {
    pub fn new(host: HostFs, pods: PodCgroups, reservations: Arc<Mutex<Store>>) -> Releaser {
        Releaser {
            host,
            pods,
            reservations,
        }
    }

    /// A cgroup v2 directory was created.
    pub fn on_mkdir(&mut self, rel: &str, owner: &Owner) {
        self.pods.on_mkdir(rel, owner);
    }

    /// A cgroup v2 directory was removed: a pod's own ends its reservations.
    pub fn on_rmdir(&mut self, owner: &Owner) -> Ended {
        match self.pods.on_rmdir(owner) {
            Some(uid) => self.release(|r, _| (r.pod_uid == uid).then_some(Released::PodRemoved)),
            None => Vec::new(),
        }
    }

    /// The pods a rescan found: those gone since the last one end their reservations.
    pub fn replace_pods(&mut self, pods: PodCgroups) -> Ended {
        let gone = self.pods.gone_in(&pods);
        self.pods = pods;
        if gone.is_empty() {
            return Vec::new();
        }
        self.release(|r, _| gone.contains(&r.pod_uid).then_some(Released::PodRemoved))
    }

    /// Ends the expired reservations and those whose pods have faulted their pages.
    pub fn release_faulted(&self, now: SystemTime) -> Ended {
        self.release(|r, this| {
            if r.expires_at <= now {
                Some(Released::Expired)
            } else {
                this.has_faulted(r).then_some(Released::Faulted)
            }
        })
    }

    /// Whether `r`'s pod cgroup is charged with at least the reserved bytes of every size.
    fn has_faulted(&self, r: &Reservation) -> bool {
        let Some((dir, hierarchy)) = self.pods.dir(&r.pod_uid) else {
            return false;
        };
        let sizes: Vec<PageSize> = r.bytes.keys().copied().collect();
        match hugetlb_cgroup::read(&self.host, dir, hierarchy, &sizes) {
            Ok(usage) => r.bytes.iter().all(|(size, &bytes)| {
                usage
                    .iter()
                    .any(|u| u.page_size_bytes == size.0 && u.in_use_bytes >= bytes)
            }),
            Err(err) => {
                debug!("reading the hugetlb usage of pod {}: {err}", r.pod_uid);
                false
            }
        }
    }

    /// Releases the reservations `pick` gives a reason for (one save), and logs each.
    fn release(&self, pick: impl Fn(&Reservation, &Releaser) -> Option<Released>) -> Ended {
        let Ok((gone, snapshot)) = self
            .reservations
            .lock()
            .map(|mut store| store.release(|r| pick(r, self)))
        else {
            warn!("the reservation store is poisoned");
            return Vec::new();
        };
        for (r, why) in &gone {
            info!(id = %r.id, pod_uid = %r.pod_uid, reason = ?why, "reservation released");
        }
        // Written without the lock: admissions do not wait for this disk write.
        if let Some(snapshot) = snapshot
            && let Err(err) = snapshot.write()
        {
            warn!(
                "saving the reservations: {err}; the file keeps the released ones until they expire"
            );
        }
        gone
    }
}

#[cfg(test)]
mod tests;
