//! KEP-5394's logic, per scope and resource (memory and io; cpu is not a condition), over the
//! `some` line of a pressure file and a threshold in percent:
//!
//! * avg60 ≥ threshold → event "high pressure" (once, when avg60 rises to the threshold);
//! * avg60 ≥ threshold and avg10 ≥ threshold → condition True;
//! * condition True and avg10 < threshold → event "trending lower" (once per dip);
//! * avg60 < threshold → condition False.
//!
//! Flapping is prevented by the two averages: the condition needs both to be high to become
//! True, and only the slow one (avg60) to fall to become False, so avg10 swinging around the
//! threshold while avg60 stays high changes nothing but one "trending lower" event per dip.
//! `some` (any task stalled) rather than `full` is used: it is the earlier signal the KEP wants
//! for stopping new pods, and `full` does not exist for every file.
//!
//! [`Tracker`] is pure: it takes readings and times, and returns the conditions and events.

use std::{collections::BTreeMap, time::SystemTime};

use serde::{Serialize, Serializer};

use super::{Resource, Scope, parse::Line};

/// The conditions this module sets, in the order the API lists them.
pub const CONDITIONS: [(Scope, Resource); 4] = [
    (Scope::System, Resource::Memory),
    (Scope::System, Resource::Io),
    (Scope::Kubepods, Resource::Memory),
    (Scope::Kubepods, Resource::Io),
];

/// `SystemMemoryContentionPressure`, `KubepodsDiskContentionPressure`, …
pub fn condition_type(scope: Scope, resource: Resource) -> String {
    let scope = match scope {
        Scope::System => "System",
        Scope::Kubepods => "Kubepods",
    };
    format!("{scope}{}ContentionPressure", kind(resource))
}

/// The word the KEP uses for a resource: io is "Disk".
fn kind(resource: Resource) -> &'static str {
    match resource {
        Resource::Memory => "Memory",
        Resource::Io => "Disk",
        Resource::Cpu => "Cpu",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    True,
    False,
    Unknown,
}

/// A Kubernetes `NodeCondition`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: Status,
    pub reason: String,
    pub message: String,
    #[serde(serialize_with = "rfc3339")]
    pub last_transition_time: SystemTime,
    #[serde(serialize_with = "rfc3339")]
    pub last_heartbeat_time: SystemTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes-style event: a transition or a notable reading.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: EventType,
    pub reason: String,
    pub message: String,
    pub scope: Scope,
    pub resource: Resource,
    #[serde(serialize_with = "rfc3339")]
    pub time: SystemTime,
}

fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_rfc3339_millis(*t).to_string())
}

#[derive(Debug, Clone)]
struct State {
    condition: NodeCondition,
    /// avg60 was at or above the threshold at the last reading.
    high60: bool,
    /// A "trending lower" event was sent for the current dip of avg10.
    dipped: bool,
}

/// The conditions and what happened to them, fed one reading at a time.
#[derive(Debug, Clone)]
pub struct Tracker {
    states: BTreeMap<(Scope, Resource), State>,
}

impl Tracker {
    /// Every condition `Unknown` until its first reading.
    pub fn new(now: SystemTime) -> Tracker {
        let states = CONDITIONS
            .iter()
            .map(|&(scope, resource)| {
                let condition = NodeCondition {
                    kind: condition_type(scope, resource),
                    status: Status::Unknown,
                    reason: "PressureNotReadYet".to_owned(),
                    message: "no pressure reading yet".to_owned(),
                    last_transition_time: now,
                    last_heartbeat_time: now,
                };
                let state = State {
                    condition,
                    high60: false,
                    dipped: false,
                };
                ((scope, resource), state)
            })
            .collect();
        Tracker { states }
    }

    /// The conditions, in [`CONDITIONS`] order.
    pub fn conditions(&self) -> Vec<NodeCondition> {
        CONDITIONS
            .iter()
            .filter_map(|key| self.states.get(key).map(|s| s.condition.clone()))
            .collect()
    }

    /// Whether the condition of `scope` and `resource` is True.
    pub fn is_true(&self, scope: Scope, resource: Resource) -> bool {
        self.states
            .get(&(scope, resource))
            .is_some_and(|s| s.condition.status == Status::True)
    }

    /// The scope cannot be read: its conditions become Unknown with `why`.
    pub fn unavailable(&mut self, scope: Scope, why: &str, now: SystemTime) -> Vec<Event> {
        let mut events = Vec::new();
        for (&(s, resource), state) in self.states.iter_mut().filter(|((s, _), _)| *s == scope) {
            let c = &mut state.condition;
            c.last_heartbeat_time = now;
            c.message = why.to_owned();
            if c.status != Status::Unknown {
                c.status = Status::Unknown;
                c.reason = "PressureUnavailable".to_owned();
                c.last_transition_time = now;
                events.push(Event {
                    kind: EventType::Warning,
                    reason: "PressureUnavailable".to_owned(),
                    message: format!("{}: {why}", c.kind),
                    scope: s,
                    resource,
                    time: now,
                });
            } else {
                c.reason = "PressureUnavailable".to_owned();
            }
            state.high60 = false;
            state.dipped = false;
        }
        events
    }

    /// One reading of `resource` in `scope` (`file` is named in messages); returns the events.
    pub fn observe(
        &mut self,
        scope: Scope,
        resource: Resource,
        some: &Line,
        threshold: f64,
        file: &str,
        now: SystemTime,
    ) -> Vec<Event> {
        let Some(state) = self.states.get_mut(&(scope, resource)) else {
            return Vec::new();
        };
        let values = format!(
            "{resource} pressure (some) avg10={:.2}% avg60={:.2}% avg300={:.2}%, threshold {threshold}%, in {file}",
            some.avg10, some.avg60, some.avg300
        );
        let high60 = some.avg60 >= threshold;
        let high10 = some.avg10 >= threshold;
        let mut events = Vec::new();
        let event = |kind, reason: String, message: String| Event {
            kind,
            reason,
            message,
            scope,
            resource,
            time: now,
        };
        let name = kind(resource);
        if high60 && !state.high60 {
            events.push(event(
                EventType::Warning,
                format!("High{name}ContentionPressure"),
                format!("{scope} {values}: avg60 reached the threshold"),
            ));
        }
        state.high60 = high60;
        let c = &mut state.condition;
        c.last_heartbeat_time = now;
        let was = c.status;
        let status = match was {
            Status::True if !high60 => Status::False,
            Status::True => Status::True,
            _ if high60 && high10 => Status::True,
            _ => Status::False,
        };
        if status == Status::True && was == Status::True && !high10 {
            if !state.dipped {
                state.dipped = true;
                events.push(event(
                    EventType::Normal,
                    format!("{name}ContentionPressureTrendingLower"),
                    format!("{scope} {values}: avg10 fell below the threshold"),
                ));
            }
        } else {
            state.dipped = false;
        }
        c.status = status;
        (c.reason, c.message) = match status {
            Status::True => (
                format!("High{name}ContentionPressure"),
                format!("avg60 and avg10 at or above the threshold: {values}"),
            ),
            _ => (
                format!("No{name}ContentionPressure"),
                format!("avg60 below the threshold: {values}"),
            ),
        };
        if status != was {
            c.last_transition_time = now;
            if was != Status::Unknown || status == Status::True {
                let (kind, verb) = if status == Status::True {
                    (EventType::Warning, "Has")
                } else {
                    (EventType::Normal, "HasNo")
                };
                events.push(event(
                    kind,
                    format!("Node{verb}{}", c.kind),
                    format!("{} is {status:?}: {}", c.kind, c.message),
                ));
            }
        }
        events
    }
}

#[cfg(test)]
mod tests;
