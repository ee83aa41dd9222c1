//! Following one kind of object by list+watch, for the webhook's caches (the Nodes of
//! [`super::cache`], the agents' pods of [`super::agent_pods`]): kube-rs's watcher, which lists,
//! then watches from the list's `resourceVersion` (bookmarks asked for) and lists again when the
//! watch says that version is gone (`ERROR` with `410`). One case it does not handle is the
//! API server answering the watch's *start* with `410 Gone`: kube-rs would retry that watch from
//! the same version for ever, so a new watcher is made here, which lists again. Other errors
//! are retried with kube-rs's backoff, logged, and reported to the caller, whose cache keeps
//! what it had meanwhile.

use std::fmt::Debug;

use futures_util::StreamExt;
use kube::{
    Api, Resource,
    runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::warn;

/// Follows `api`'s objects under `config` until `stop` turns true, handing each event to `event`
/// and calling `failed` on each error; `what` names them in the log ("the Node watch").
pub async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    mut stop: watch::Receiver<bool>,
    mut event: impl FnMut(Event<K>),
    mut failed: impl FnMut(),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        let events = watcher::watcher(api.clone(), config.clone()).default_backoff();
        let mut events = std::pin::pin!(events);
        let relist = loop {
            let item = tokio::select! {
                _ = stop.wait_for(|s| *s) => break false,
                item = events.next() => item,
            };
            match item {
                Some(Ok(e)) => event(e),
                Some(Err(e)) => {
                    failed();
                    if gone(&e) {
                        warn!("{what} was answered 410 Gone: listing again: {e}");
                        break true;
                    }
                    warn!("{what} failed, retrying with backoff: {e}");
                }
                None => break false,
            }
        };
        if !relist {
            return;
        }
    }
}

/// A watch whose start the API server answered `410 Gone`.
fn gone(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 410)
}
