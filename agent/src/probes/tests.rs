use super::*;
use crate::sysfs::fake::tree;

#[test]
fn auto_attaches_the_fault_probe_by_fentry_on_preempt_rt_only() {
    let (_rt_dir, rt) = tree(&[("/sys/kernel/realtime", "1\n")]);
    let (_generic_dir, generic) = tree(&[]);
    let (_zero_dir, zero) = tree(&[("/sys/kernel/realtime", "0\n")]);
    assert_eq!(
        FaultPath::resolve(FaultAttach::Auto, &rt),
        FaultPath::Fentry
    );
    for host in [&generic, &zero] {
        assert_eq!(
            FaultPath::resolve(FaultAttach::Auto, host),
            FaultPath::Tracepoint
        );
    }
    // What is asked is taken, whatever the kernel.
    assert_eq!(
        FaultPath::resolve(FaultAttach::Tracepoint, &rt),
        FaultPath::Tracepoint
    );
    assert_eq!(
        FaultPath::resolve(FaultAttach::Fentry, &generic),
        FaultPath::Fentry
    );
    assert_eq!(
        FaultPath::Tracepoint.describe(),
        "raw_tracepoint exceptions/page_fault_user"
    );
    assert_eq!(FaultPath::Fentry.describe(), "fentry hugetlb_fault");
}
