use super::*;

fn made(uid: &str, node: &str, id: &str) -> Made {
    Made {
        uid: uid.to_owned(),
        namespace: "telco".to_owned(),
        name: "dpdk-0".to_owned(),
        node: node.to_owned(),
        agent: "127.0.0.2:9820".parse().expect("address"),
        id: id.to_owned(),
    }
}

fn pod(uid: &str, node: Option<&str>) -> Seen {
    Seen::Pod {
        uid: uid.to_owned(),
        node: node.map(str::to_owned),
    }
}

#[test]
fn only_the_pod_of_that_uid_bound_to_that_node_confirms() {
    let m = made("u1", "worker-1", "1-1");
    assert_eq!(decide(&m, &pod("u1", Some("worker-1"))), Ok(()));
    assert_eq!(decide(&m, &pod("u1", None)), Err(Unconfirmed::NotBound));
    assert_eq!(decide(&m, &pod("u1", Some(""))), Err(Unconfirmed::NotBound));
    assert_eq!(
        decide(&m, &pod("u1", Some("worker-2"))),
        Err(Unconfirmed::BoundElsewhere)
    );
    assert_eq!(
        decide(&m, &pod("u2", Some("worker-1"))),
        Err(Unconfirmed::UidChanged)
    );
    assert_eq!(decide(&m, &Seen::Gone), Err(Unconfirmed::Gone));
    assert_eq!(decide(&m, &Seen::Unreadable), Err(Unconfirmed::Unreadable));
}

#[test]
fn a_pod_holds_one_node_and_a_resend_keeps_its_first_deadline() {
    let within = Duration::from_secs(10);
    let pending = Pending::new(within);
    let t0 = Instant::now();
    assert_eq!(pending.record(made("u1", "worker-1", "1-1"), t0), None);
    // Resent to the same node 8 s later: the agent's new id, the first deadline.
    let later = t0 + Duration::from_secs(8);
    assert_eq!(pending.record(made("u1", "worker-1", "1-2"), later), None);
    assert_eq!(pending.due(t0 + Duration::from_secs(9)), vec![]);
    assert_eq!(
        pending.due(t0 + within),
        vec![made("u1", "worker-1", "1-2")]
    );
    // Another node: the earlier reservation is handed back at once.
    assert_eq!(pending.record(made("u2", "worker-1", "2-1"), t0), None);
    assert_eq!(
        pending.record(made("u2", "worker-2", "3-1"), t0),
        Some(made("u2", "worker-1", "2-1"))
    );
    assert_eq!(
        pending.due(t0 + within),
        vec![made("u2", "worker-2", "3-1")]
    );
    assert_eq!(pending.due(t0 + within * 2), vec![]);
}

#[test]
fn the_set_is_bounded() {
    let pending = Pending::new(Duration::from_secs(10));
    let t0 = Instant::now();
    for i in 0..MAX_PENDING {
        pending.record(made(&format!("u{i}"), "worker-1", "1-1"), t0);
    }
    assert!(!pending.has_room("new"));
    assert!(pending.has_room("u0"), "a pod already held may be resent");
    pending.record(made("new", "worker-1", "1-1"), t0);
    assert_eq!(pending.due(t0 + Duration::from_secs(10)).len(), MAX_PENDING);
    assert!(pending.has_room("new"));
}
