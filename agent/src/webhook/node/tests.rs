use serde_json::{json, value::RawValue};

use super::*;
use crate::host::PageSize;

/// `value` as the text an object arrives in.
fn raw(value: &serde_json::Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("JSON")
}

/// The candidate the cache keeps of the Node `value`, its agent on `port`.
fn candidate(value: &serde_json::Value, port: u16) -> Candidate {
    let name = name_of(&raw(value)).expect("a name");
    let node: Node = serde_json::from_value(value.clone()).expect("a v1.Node");
    of_node(name, &node, port)
}

#[test]
fn the_agent_is_at_the_first_internal_ip_and_allocatable_hugepages_are_read() {
    let node = json!({
        "metadata": {"name": "worker-1"},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "worker-1"},
                {"type": "InternalIP", "address": "10.0.0.7"},
                {"type": "InternalIP", "address": "fd00::7"}
            ],
            "allocatable": {"cpu": "4", "memory": "16Gi", "hugepages-2Mi": "4Gi", "hugepages-1Gi": "0"}
        }
    });
    let c = candidate(&node, 9820);
    assert_eq!(c.name, "worker-1");
    assert_eq!(c.agent, Ok("10.0.0.7:9820".parse().expect("address")));
    assert_eq!(
        c.allocatable,
        Some(Hugepages::from([(PageSize(2 << 20), 4 << 30)]))
    );
}

#[test]
fn a_node_without_an_internal_ip_or_allocatable_says_so_and_one_without_a_name_is_refused() {
    let node = json!({"metadata": {"name": "n"}, "status": {"addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}]}});
    let c = candidate(&node, 9820);
    assert_eq!(
        c.agent,
        Err("the Node has no InternalIP in status.addresses".to_owned())
    );
    assert_eq!(c.allocatable, None);
    let node = json!({"metadata": {"name": "n"}, "status": {"addresses": [{"type": "InternalIP", "address": "node-1"}]}});
    let c = candidate(&node, 9820);
    assert_eq!(
        c.agent,
        Err("the Node's InternalIP \"node-1\" is not an IP address".to_owned())
    );
    assert_eq!(name_of(&raw(&json!({"metadata": {}}))), None);
    assert_eq!(name_of(&raw(&json!({"metadata": {"name": ""}}))), None);
    assert_eq!(name_of(&raw(&json!([]))), None);
}
