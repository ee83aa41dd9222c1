//! The per-CPU counter map every program increments: what was seen, filtered out, and lost.

/// Per-CPU array of `u64`, indexed by [`Counter`].
pub const MAP: &str = "COUNTERS";

/// One slot of the counter map. Every run of the fault program ends in exactly one of the
/// `Faults*`, `FindVma*` and `HugetlbFaults*` outcomes, so faults seen is their sum (see
/// [`Counter::FAULT_OUTCOMES`]): the hot path pays for one increment, not two.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Faults skipped before `bpf_find_vma` because their cgroup is not watched (mostly counted in
    /// the per-CPU verdict cache, see `page_fault_user::CgroupVerdict::filtered`).
    FaultsFiltered = 0,
    /// Faults inspected whose VMA is not hugetlb.
    FaultsNotHugetlb = 1,
    /// `bpf_find_vma` gave up because the mmap lock was held (-EBUSY): possibly a missed fault.
    FindVmaBusy = 2,
    /// `bpf_find_vma` failed otherwise (no VMA at the address, for instance).
    FindVmaFailed = 3,
    /// Hugetlb faults written to the ring buffer.
    HugetlbFaults = 4,
    /// Hugetlb faults lost because the ring buffer was full.
    HugetlbFaultsLost = 5,
    /// Cgroup events written to the ring buffer.
    CgroupEvents = 6,
    /// Cgroup events lost because the ring buffer was full.
    CgroupEventsLost = 7,
    /// hugetlbfs inode events (`hugetlbfs/*`) written to the ring buffer.
    HugetlbfsEvents = 8,
    /// hugetlbfs inode events lost because the ring buffer was full.
    HugetlbfsEventsLost = 9,
}

impl Counter {
    /// The outcomes of one run of the fault program; their sum is every fault seen.
    pub const FAULT_OUTCOMES: [Counter; 6] = [
        Counter::FaultsFiltered,
        Counter::FaultsNotHugetlb,
        Counter::FindVmaBusy,
        Counter::FindVmaFailed,
        Counter::HugetlbFaults,
        Counter::HugetlbFaultsLost,
    ];

    /// The outcomes of one run of a cgroup program.
    pub const CGROUP_OUTCOMES: [Counter; 2] = [Counter::CgroupEvents, Counter::CgroupEventsLost];

    /// The outcomes of one run of a hugetlbfs program.
    pub const HUGETLBFS_OUTCOMES: [Counter; 2] =
        [Counter::HugetlbfsEvents, Counter::HugetlbfsEventsLost];

    /// Number of slots in the map.
    pub const COUNT: u32 = (Self::FAULT_OUTCOMES.len()
        + Self::CGROUP_OUTCOMES.len()
        + Self::HUGETLBFS_OUTCOMES.len()) as u32;

    /// Every counter, in slot order.
    pub fn all() -> impl Iterator<Item = Counter> {
        Self::FAULT_OUTCOMES
            .into_iter()
            .chain(Self::CGROUP_OUTCOMES)
            .chain(Self::HUGETLBFS_OUTCOMES)
    }

    /// Stable snake_case name, used in logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::FaultsFiltered => "faults_filtered",
            Counter::FaultsNotHugetlb => "faults_not_hugetlb",
            Counter::FindVmaBusy => "find_vma_busy",
            Counter::FindVmaFailed => "find_vma_failed",
            Counter::HugetlbFaults => "hugetlb_faults",
            Counter::HugetlbFaultsLost => "hugetlb_faults_lost",
            Counter::CgroupEvents => "cgroup_events",
            Counter::CgroupEventsLost => "cgroup_events_lost",
            Counter::HugetlbfsEvents => "hugetlbfs_events",
            Counter::HugetlbfsEventsLost => "hugetlbfs_events_lost",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Counter;

    #[test]
    fn every_slot_appears_once_in_slot_order() {
        for (slot, counter) in Counter::all().enumerate() {
            assert_eq!(counter as usize, slot, "{}", counter.name());
        }
        assert_eq!(Counter::all().count(), Counter::COUNT as usize);
    }
}
