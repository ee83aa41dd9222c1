use super::*;
use crate::{
    host::PageSize,
    webhook::agents::{CheckReply, Reply},
};

const MI2: PageSize = PageSize(2 << 20);
const GI1: PageSize = PageSize(1 << 30);

fn fits(nodes: &[u32], checks: &[(u64, u64)]) -> Judged {
    Judged::Fits(Reply {
        allowed: true,
        reason: None,
        message: None,
        numa_nodes: nodes.to_vec(),
        checks: checks
            .iter()
            .map(|&(requested_bytes, available_bytes)| CheckReply {
                resource: "hugepages-2Mi".to_owned(),
                requested_bytes,
                available_bytes,
            })
            .collect(),
        reservation: None,
    })
}

#[test]
fn one_numa_node_scores_above_spanning_then_headroom_decides() {
    let g = 1u64 << 30;
    // Single NUMA node: 6 + floor(4 × spare / available).
    assert_eq!(score(&fits(&[0], &[(2 * g, 2 * g)])), 6, "no headroom");
    assert_eq!(score(&fits(&[0], &[(g, 2 * g)])), 8, "half spare");
    assert_eq!(score(&fits(&[1], &[(0, 4 * g)])), 10, "all spare");
    // Across two: 1 + the same points; even the roomiest spanning fit is below a tight single one.
    assert_eq!(score(&fits(&[0, 1], &[(0, 4 * g)])), 5);
    assert_eq!(score(&fits(&[0, 1], &[(3 * g, 4 * g)])), 2);
    // The tightest size decides.
    assert_eq!(score(&fits(&[0], &[(0, 4 * g), (4 * g, 4 * g)])), 6);
    // Nothing available and nothing checked earn no headroom.
    assert_eq!(score(&fits(&[0], &[(0, 0)])), 6);
    assert_eq!(score(&fits(&[], &[])), 6);
    for not_fitting in [
        Judged::Misfit("no".into()),
        Judged::Unresolvable("never".into()),
        Judged::Silent("down".into()),
    ] {
        assert_eq!(score(&not_fitting), 0);
    }
}

#[test]
fn a_node_with_less_allocatable_than_the_need_is_unresolvable_and_unknown_is_asked() {
    let need = Hugepages::from([(MI2, 4 << 30)]);
    let small = Hugepages::from([(MI2, 2 << 30)]);
    assert_eq!(
        unresolvable(&need, Some(&small)).as_deref(),
        Some(
            "the node's allocatable hugepages-2Mi is 2Gi, less than the pod's 4Gi: preemption cannot help"
        )
    );
    let other_size = Hugepages::from([(GI1, 8 << 30)]);
    assert!(unresolvable(&need, Some(&other_size)).is_some_and(|m| m.contains("is 0,")));
    let enough = Hugepages::from([(MI2, 4 << 30)]);
    assert_eq!(unresolvable(&need, Some(&enough)), None);
    assert_eq!(unresolvable(&need, None), None, "unknown: the agent says");
}

#[test]
fn filter_keeps_fits_fails_misfits_and_applies_the_policy_to_silence() {
    let judged = [
        ("a", fits(&[0], &[])),
        (
            "b",
            Judged::Misfit(
                "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 4Gi, available 2Gi"
                    .into(),
            ),
        ),
        ("c", Judged::Unresolvable("too small".into())),
        (
            "d",
            Judged::Silent("agent at 10.0.0.4:9820: no answer within 2s".into()),
        ),
    ];
    let each = || judged.iter().map(|(n, j)| (*n, j));
    let ignore = filter(each(), FailurePolicy::Ignore);
    assert_eq!(ignore.kept, [0, 3]);
    assert_eq!(
        ignore.failed,
        FailedNodes::from([(
            "b".to_owned(),
            "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 4Gi, available 2Gi"
                .to_owned()
        )])
    );
    assert_eq!(
        ignore.unresolvable,
        FailedNodes::from([("c".to_owned(), "too small".to_owned())])
    );
    let fail = filter(each(), FailurePolicy::Fail);
    assert_eq!(fail.kept, [0]);
    assert_eq!(
        fail.failed.get("d").map(String::as_str),
        Some(
            "hugepage verification unavailable (--failure-policy fail): agent at 10.0.0.4:9820: no answer within 2s"
        )
    );
}

#[test]
fn a_refusal_without_a_message_names_its_reason() {
    let reply = Reply {
        allowed: false,
        reason: Some("NodeUnderMemoryContentionPressure".into()),
        message: None,
        numa_nodes: vec![],
        checks: vec![],
        reservation: None,
    };
    assert_eq!(
        judge(Heard::Answer(reply)),
        Judged::Misfit("refused by the hugepage agent (NodeUnderMemoryContentionPressure)".into())
    );
}
