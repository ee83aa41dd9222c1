use super::*;
use crate::sysfs::fake::tree;

#[test]
fn auto_tries_fexit_first_then_the_tracepoint_or_fentry_on_preempt_rt() {
    let (_rt_dir, rt) = tree(&[("/sys/kernel/realtime", "1\n")]);
    let (_generic_dir, generic) = tree(&[]);
    let (_zero_dir, zero) = tree(&[("/sys/kernel/realtime", "0\n")]);
    assert_eq!(
        FaultPath::resolve(FaultAttach::Auto, &rt),
        (FaultPath::Fexit, Some(FaultPath::Fentry))
    );
    for host in [&generic, &zero] {
        assert_eq!(
            FaultPath::resolve(FaultAttach::Auto, host),
            (FaultPath::Fexit, Some(FaultPath::Tracepoint))
        );
    }
    // What is asked is taken, whatever the kernel, with nothing to fall back on.
    assert_eq!(
        FaultPath::resolve(FaultAttach::Tracepoint, &rt),
        (FaultPath::Tracepoint, None)
    );
    assert_eq!(
        FaultPath::resolve(FaultAttach::Fentry, &generic),
        (FaultPath::Fentry, None)
    );
    assert_eq!(
        FaultPath::resolve(FaultAttach::Fexit, &generic),
        (FaultPath::Fexit, None)
    );
    assert_eq!(FaultPath::Fexit.describe(), "fexit hugetlb_fault");
    assert_eq!(
        FaultPath::Tracepoint.describe(),
        "raw_tracepoint exceptions/page_fault_user"
    );
    assert_eq!(FaultPath::Fentry.describe(), "fentry hugetlb_fault");
}
