//! What every call of the webhook needs besides its arguments: the agents' client, the failure
//! policy and deadline, the metrics, the Node cache, the Kubernetes API client (for the pod of a
//! binding), what request bodies may take (the budget, the extender's limit), the scheduler
//! pods are given, the table the agents' streams keep, and the reservations awaiting
//! confirmation.

use std::{sync::Arc, time::Duration};

use super::{
    FailurePolicy, agents::Client, cache::NodeCache, confirm::Pending, metrics::Metrics,
    table::Table,
};
use crate::api::budget::BodyBudget;

#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub policy: FailurePolicy,
    /// One deadline for all the agent calls of one call.
    pub timeout: Duration,
    pub metrics: Arc<Metrics>,
    pub nodes: NodeCache,
    pub kube: kube::Client,
    /// What the listener's request bodies may hold at once (`--body-budget`).
    pub bodies: Arc<BodyBudget>,
    /// The largest `ExtenderArgs` body (`--extender-body-limit`).
    pub extender_body_limit: usize,
    /// The scheduler `/admission/mutate` gives pods (`--scheduler-name`).
    pub scheduler_name: std::sync::Arc<str>,
    /// The agents' streamed states (`--agent-streams`).
    pub table: Option<Arc<Table>>,
    /// The reservations bindings made, awaiting the API's confirmation.
    pub pending: Arc<Pending>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("client", &self.client)
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}
