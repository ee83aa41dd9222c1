//! The API's side of the reservation file: a reservation an admission made ([`Pending`]) is
//! written by [`persist`] before the admission is answered, and `DELETE /v1/reservations/{id}`
//! ([`delete`]) writes the file without the deleted one. The writes (an fsync each) run on a
//! blocking thread, so the API thread, which serves every other request, never waits for the
//! disk; the store's lock is not held meanwhile (see [`crate::admission::reservations`]).

use super::{AppState, error::ApiError};
use crate::admission::reservations::{Released, Reservation, Snapshot};

/// A reservation an admission made, in memory, with the pod's earlier reservations it replaced
/// and the snapshot of the file that holds it.
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    pub replaced: Vec<Reservation>,
    pub snapshot: Snapshot,
}

/// Writes `snapshot` on a blocking thread.
async fn write(snapshot: Snapshot) -> Result<(), String> {
    match tokio::task::spawn_blocking(move || snapshot.write()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("the write did not finish: {e}")),
    }
}

/// Writes the reservation an admission made. If it cannot be written, the reservation is taken
/// back and the pod's earlier one it replaced put back (and the file written so, should a later
/// admission's write have carried the new one), and the admission fails.
pub async fn persist(state: &AppState, pending: Pending) -> Result<(), ApiError> {
    let Pending {
        id,
        replaced,
        snapshot,
    } = pending;
    let Err(failure) = write(snapshot).await else {
        return Ok(());
    };
    let undo = state
        .reservations
        .lock()
        .ok()
        .and_then(|mut store| store.take_back(&id, replaced));
    if let Some(snapshot) = undo
        && let Err(again) = write(snapshot).await
    {
        tracing::warn!(%id, "writing the reservations without {id}: {again}");
    }
    tracing::warn!(%id, "the reservation could not be saved, so the admission failed: {failure}");
    Err(ApiError::state_write_failed(format!(
        "the reservation could not be saved, so the pod is not admitted: {failure}"
    )))
}

/// `DELETE /v1/reservations/{id}`: the removed reservation, or 404.
pub async fn delete(state: &AppState, id: &str) -> Result<Reservation, ApiError> {
    let (removed, snapshot) = state
        .reservations
        .lock()
        .map_err(|_| ApiError::internal("the reservation store is poisoned"))?
        .release(|r| (r.id == id).then_some(Released::Deleted));
    let (found, _) = removed
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::no_reservation(id))?;
    state.metrics.reservation_ended(Released::Deleted);
    tracing::info!(id = %found.id, pod_uid = %found.pod_uid, "reservation deleted");
    if let Some(snapshot) = snapshot {
        write(snapshot).await.map_err(|e| {
            ApiError::state_write_failed(format!(
                "reservation {id} is deleted, but the file still holds it until it expires: {e}"
            ))
        })?;
    }
    Ok(found)
}
