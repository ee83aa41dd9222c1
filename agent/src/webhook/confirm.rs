//! Confirmation of the reservations bindings make. The webhook cannot tell who sent an
//! admission review, so a reservation is held only as long as the API server backs it: each one a
//! binding (or a pod created on a node) made is [`Pending`] until `--reservation-confirm-within`
//! has passed, then the pod is read through the API and the reservation [`decide`]d. It is
//! confirmed when the pod of that UID is bound to that node (`spec.nodeName`, which a pod created
//! there has from the start); otherwise it is released on its agent
//! (`DELETE /v1/reservations/{id}`) and counted in
//! `hugepage_agent_webhook_unconfirmed_reservations_total{reason}`.
//!
//! A pod holds a reservation on one node at a time: a new reservation of the same UID on
//! another node releases the earlier one at once (`moved`). A resend of the same pod to the same
//! node keeps the first one's deadline, so resending never keeps a reservation past the window.
//! The set is bounded ([`MAX_PENDING`]): when it is full a binding is not verified and the
//! failure policy decides. It is held in memory: a webhook restart loses it, and the agents'
//! `--reservation-ttl` ends what it held.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::{sync::watch, time::Instant};
use tracing::{debug, info, warn};

use super::{
    agents::Client,
    metrics::{Metrics, UNCONFIRMED, Unconfirmed},
};

/// The most reservations awaiting confirmation at once (a binding a second for the window's
/// 10 s is 10; this is room for a thousand a second).
pub const MAX_PENDING: usize = 16_384;
/// How often the due reservations are looked at.
const TICK: Duration = Duration::from_millis(250);

/// A reservation a binding made on `node`'s agent at `agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub agent: SocketAddr,
    /// The agent's reservation id.
    pub id: String,
}

/// What the API shows of the pod when its reservation is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Pod { uid: String, node: Option<String> },
    Gone,
    Unreadable,
}

/// Whether `seen` confirms `made`, or why not.
pub fn decide(made: &Made, seen: &Seen) -> Result<(), Unconfirmed> {
    match seen {
        Seen::Gone => Err(Unconfirmed::Gone),
        Seen::Unreadable => Err(Unconfirmed::Unreadable),
        Seen::Pod { uid, .. } if *uid != made.uid => Err(Unconfirmed::UidChanged),
        Seen::Pod { node: None, .. } => Err(Unconfirmed::NotBound),
        Seen::Pod { node: Some(n), .. } if n.is_empty() => Err(Unconfirmed::NotBound),
        Seen::Pod { node: Some(n), .. } if *n != made.node => Err(Unconfirmed::BoundElsewhere),
        Seen::Pod { .. } => Ok(()),
    }
}

/// The reservations awaiting confirmation, by pod UID, each with its deadline.
#[derive(Debug)]
pub struct Pending {
    within: Duration,
    by_uid: Mutex<HashMap<String, (Made, Instant)>>,
}

impl Pending {
    /// Reservations are confirmed `within` of their first binding.
    pub fn new(within: Duration) -> Pending {
        Pending {
            within,
            by_uid: Mutex::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Made, Instant)>> {
        self.by_uid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a reservation of pod `uid` may be made: one is already pending for it, or there is
    /// room for one more.
    pub fn has_room(&self, uid: &str) -> bool {
        let held = self.held();
        held.contains_key(uid) || held.len() < MAX_PENDING
    }

    /// Records `made` at `now`, and returns the reservation of the same pod on another node it
    /// replaces, to release at once. The same pod on the same node keeps its first deadline.
    pub fn record(&self, made: Made, now: Instant) -> Option<Made> {
        let mut held = self.held();
        let (due, earlier) = match held.remove(&made.uid) {
            Some((earlier, due)) if earlier.node == made.node => (due, None),
            Some((earlier, _)) => (now + self.within, Some(earlier)),
            None => (now + self.within, None),
        };
        if held.len() < MAX_PENDING {
            held.insert(made.uid.clone(), (made, due));
        }
        earlier
    }

    /// Takes out the reservations due at `now`.
    pub fn due(&self, now: Instant) -> Vec<Made> {
        let mut held = self.held();
        let due: Vec<String> = held
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        due.iter()
            .filter_map(|uid| held.remove(uid).map(|(made, _)| made))
            .collect()
    }
}

/// Confirms or releases the due reservations of `pending` every [`TICK`], until `stop` turns true.
pub async fn run(
    pending: Arc<Pending>,
    kube: kube::Client,
    client: Client,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = every.tick() => {}
        }
        for made in pending.due(Instant::now()) {
            let seen = read(&kube, &made).await;
            match decide(&made, &seen) {
                Ok(()) => {
                    debug!(pod = %made.uid, node = made.node, "reservation confirmed by the API")
                }
                Err(why) => release(&client, &metrics, &made, why).await,
            }
        }
    }
}

/// Releases `made` on its agent, counted as `why`.
pub async fn release(client: &Client, metrics: &Metrics, made: &Made, why: Unconfirmed) {
    metrics.unconfirmed(why);
    let reason = UNCONFIRMED[why as usize];
    match client.release(&made.node, made.agent, &made.id).await {
        Ok(()) => info!(
            pod = %format_args!("{}/{}", made.namespace, made.name),
            uid = made.uid,
            node = made.node,
            reason,
            "reservation not confirmed by the API: released"
        ),
        Err(e) => warn!(
            pod = %format_args!("{}/{}", made.namespace, made.name),
            node = made.node,
            reason,
            "reservation not confirmed by the API, and its release failed (its --reservation-ttl ends it): {e}"
        ),
    }
}

/// The pod of `made` as the API has it.
async fn read(kube: &kube::Client, made: &Made) -> Seen {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &made.namespace);
    match pods.get(&made.name).await {
        Ok(pod) => Seen::Pod {
            uid: pod.metadata.uid.unwrap_or_default(),
            node: pod.spec.and_then(|s| s.node_name),
        },
        Err(kube::Error::Api(status)) if status.code == 404 => Seen::Gone,
        Err(e) => {
            warn!(pod = %format_args!("{}/{}", made.namespace, made.name), "a reservation's pod cannot be read: {e}");
            Seen::Unreadable
        }
    }
}

#[cfg(test)]
mod tests;
