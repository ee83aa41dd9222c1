use super::*;
use crate::telemetry::encode::Format;

fn metrics() -> Metrics {
    Metrics::new(
        &[PageSize(2 << 20), PageSize(1 << 30)],
        &[NumaNode(0), NumaNode(1)],
        Arc::default(),
    )
}

fn text(m: &Metrics) -> String {
    let mut e = Encoder::new(Format::Prometheus);
    m.encode(&mut e);
    e.finish()
}

#[test]
fn the_histogram_is_cumulative_and_sums_seconds() {
    let h = Histogram::new(&VERIFICATION_BUCKETS);
    h.observe(Duration::from_micros(4));
    h.observe(Duration::from_micros(700));
    h.observe(Duration::from_millis(200));
    let v = h.value();
    assert_eq!(v.count, 3);
    assert_eq!(v.buckets[0], (0.00001, 1));
    assert_eq!(v.buckets[5], (0.0005, 1));
    assert_eq!(v.buckets[6], (0.001, 2));
    assert_eq!(
        v.buckets.last(),
        Some(&(0.1, 2)),
        "200 ms is above every bound"
    );
    assert!((v.sum - 0.200704).abs() < 1e-9, "{}", v.sum);
}

#[test]
fn labels_stay_within_the_hosts_sizes_and_nodes() {
    let m = metrics();
    m.fault(0, Some(PageSize(2 << 20)));
    m.fault(7, Some(PageSize(2 << 20)));
    m.fault(1, Some(PageSize(64 << 10)));
    m.fault(1, None);
    let t = text(&m);
    for (series, value) in [
        (
            r#"hugepage_agent_hugetlb_faults_total{numa_node="0",hugepage_size="2Mi"} "#,
            "1",
        ),
        (
            r#"hugepage_agent_hugetlb_faults_total{numa_node="other",hugepage_size="2Mi"} "#,
            "1",
        ),
        (
            r#"hugepage_agent_hugetlb_faults_total{numa_node="1",hugepage_size="other"} "#,
            "2",
        ),
        (
            r#"hugepage_agent_hugetlb_faults_total{numa_node="1",hugepage_size="1Gi"} "#,
            "0",
        ),
    ] {
        assert!(
            t.contains(&format!("{series}{value}\n")),
            "{series}{value} in\n{t}"
        );
    }
}

#[test]
fn the_discrepancy_gauge_is_set_replaced_and_cleared() {
    let m = metrics();
    assert!(!text(&m).contains("memory_manager_hugepages_discrepancy_bytes{"));
    m.set_discrepancy(PageSize(1 << 30), NumaNode(1), 1 << 30);
    m.set_discrepancy(PageSize(1 << 30), NumaNode(1), -(2 << 20));
    let t = text(&m);
    assert!(
        t.contains("memory_manager_hugepages_discrepancy_bytes{hugepage_size=\"1Gi\",numa_node=\"1\"} -2097152\n"),
        "{t}"
    );
    m.clear_discrepancy();
    assert!(!text(&m).contains("memory_manager_hugepages_discrepancy_bytes{"));
}

#[test]
fn probe_totals_and_reservation_ends_are_shown() {
    let m = metrics();
    m.set_probe_losses(Losses {
        hugetlb_faults_lost: 3,
        cgroup_events_lost: 0,
        hugetlbfs_events_lost: 2,
        find_vma_busy: 9,
    });
    m.reservation_ended(Released::Expired);
    m.cgroup_event(CgroupChange::AttachTask { pid: 1 });
    let t = text(&m);
    for line in [
        "hugepage_agent_ring_buffer_lost_events_total{ring_buffer=\"hugetlb_faults\"} 3\n",
        "hugepage_agent_ring_buffer_lost_events_total{ring_buffer=\"hugetlbfs_events\"} 2\n",
        "hugepage_agent_find_vma_busy_total 9\n",
        "hugepage_agent_reservations_ended_total{reason=\"expired\"} 1\n",
        "hugepage_agent_reservations_ended_total{reason=\"faulted\"} 0\n",
        "hugepage_agent_cgroup_events_total{event=\"attach_task\"} 1\n",
    ] {
        assert!(t.contains(line), "{line} in\n{t}");
    }
}
