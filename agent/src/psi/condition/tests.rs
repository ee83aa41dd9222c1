use std::time::{Duration, SystemTime};

use super::*;

const T: f64 = 10.0;
const FILE: &str = "/proc/pressure/memory";

fn line(avg10: f64, avg60: f64) -> Line {
    Line {
        avg10,
        avg60,
        avg300: 0.0,
        total: 0,
    }
}

/// Feeds (avg10, avg60) readings one second apart to the system memory condition; returns, per
/// reading, the status afterwards and the event reasons it produced.
fn run(readings: &[(f64, f64)]) -> Vec<(Status, Vec<String>)> {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut tracker = Tracker::new(start);
    readings
        .iter()
        .enumerate()
        .map(|(i, &(avg10, avg60))| {
            let now = start + Duration::from_secs(i as u64 + 1);
            let events = tracker.observe(
                Scope::System,
                Resource::Memory,
                &line(avg10, avg60),
                T,
                FILE,
                now,
            );
            let status = tracker.conditions()[0].status;
            (status, events.into_iter().map(|e| e.reason).collect())
        })
        .collect()
}

fn reasons(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn every_rule_of_the_kep_in_order() {
    let steps = run(&[
        (1.0, 1.0),   // quiet: False, no event
        (30.0, 5.0),  // a burst: avg10 high, avg60 not: still False
        (30.0, 12.0), // avg60 reaches the threshold with avg10 high: event and True
        (25.0, 15.0), // stays True, nothing new
        (8.0, 14.0),  // avg10 falls below while avg60 is high: trending lower
        (6.0, 12.0),  // still lower: no second event
        (4.0, 9.0),   // avg60 falls below: False
        (2.0, 3.0),   // quiet again
    ]);
    let expected = [
        (Status::False, reasons(&[])),
        (Status::False, reasons(&[])),
        (
            Status::True,
            reasons(&[
                "HighMemoryContentionPressure",
                "NodeHasSystemMemoryContentionPressure",
            ]),
        ),
        (Status::True, reasons(&[])),
        (
            Status::True,
            reasons(&["MemoryContentionPressureTrendingLower"]),
        ),
        (Status::True, reasons(&[])),
        (
            Status::False,
            reasons(&["NodeHasNoSystemMemoryContentionPressure"]),
        ),
        (Status::False, reasons(&[])),
    ];
    assert_eq!(steps, expected);
}

#[test]
fn avg60_high_alone_is_an_event_but_not_a_condition() {
    let steps = run(&[(5.0, 11.0), (4.0, 12.0), (3.0, 9.0), (2.0, 10.0)]);
    assert_eq!(
        steps,
        [
            (Status::False, reasons(&["HighMemoryContentionPressure"])),
            (Status::False, reasons(&[])),
            (Status::False, reasons(&[])),
            (Status::False, reasons(&["HighMemoryContentionPressure"])),
        ]
    );
}

#[test]
fn avg10_swinging_around_the_threshold_does_not_flap_the_condition() {
    let mut readings = vec![(20.0, 20.0)];
    for i in 0..10 {
        readings.push(if i % 2 == 0 {
            (9.0, 15.0)
        } else {
            (11.0, 15.0)
        });
    }
    let steps = run(&readings);
    assert!(steps.iter().all(|(s, _)| *s == Status::True), "{steps:?}");
    let count = |keep: fn(&String) -> bool| {
        steps
            .iter()
            .flat_map(|(_, r)| r)
            .filter(|r| keep(r))
            .count()
    };
    let transitions = count(|r| r.starts_with("Node"));
    assert_eq!(transitions, 1, "one transition, to True: {steps:?}");
    let dips = count(|r| r.ends_with("TrendingLower"));
    assert_eq!(dips, 5, "one trending-lower event per dip: {steps:?}");
}

#[test]
fn recovery_after_true_and_back_again() {
    let steps = run(&[(20.0, 20.0), (1.0, 1.0), (20.0, 20.0)]);
    let statuses: Vec<Status> = steps.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [Status::True, Status::False, Status::True]);
}

#[test]
fn the_threshold_itself_counts_as_high() {
    let steps = run(&[(10.0, 10.0)]);
    assert_eq!(steps[0].0, Status::True);
}

#[test]
fn conditions_carry_the_values_that_decided_them_and_transition_times() {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut tracker = Tracker::new(start);
    assert!(
        tracker
            .conditions()
            .iter()
            .all(|c| c.status == Status::Unknown)
    );
    let t1 = start + Duration::from_secs(5);
    tracker.observe(
        Scope::Kubepods,
        Resource::Io,
        &line(40.0, 35.5),
        25.0,
        "/sys/fs/cgroup/kubepods.slice/io.pressure",
        t1,
    );
    let t2 = t1 + Duration::from_secs(5);
    tracker.observe(
        Scope::Kubepods,
        Resource::Io,
        &line(41.0, 36.0),
        25.0,
        "/sys/fs/cgroup/kubepods.slice/io.pressure",
        t2,
    );
    let c = tracker
        .conditions()
        .into_iter()
        .find(|c| c.kind == "KubepodsDiskContentionPressure")
        .expect("listed");
    assert_eq!(c.status, Status::True);
    assert_eq!(c.reason, "HighDiskContentionPressure");
    assert_eq!(
        c.message,
        "avg60 and avg10 at or above the threshold: io pressure (some) avg10=41.00% avg60=36.00% avg300=0.00%, threshold 25%, in /sys/fs/cgroup/kubepods.slice/io.pressure"
    );
    assert_eq!((c.last_transition_time, c.last_heartbeat_time), (t1, t2));
    assert!(tracker.is_true(Scope::Kubepods, Resource::Io));
    assert!(!tracker.is_true(Scope::System, Resource::Io));

    let events = tracker.unavailable(Scope::Kubepods, "the kubepods cgroup is gone", t2);
    assert_eq!(
        events.len(),
        1,
        "only the True condition changes: {events:?}"
    );
    assert!(!tracker.is_true(Scope::Kubepods, Resource::Io));
}
