use super::*;

#[test]
fn addresses_are_filtered_as_they_arrive_and_backoff_keys_as_their_64() {
    let v4: IpAddr = "10.1.2.3".parse().expect("v4");
    assert_eq!(Filtered::address(v4), Filtered::V4(0x0a01_0203));
    let mapped: IpAddr = "::ffff:10.1.2.3".parse().expect("mapped");
    assert_eq!(Filtered::address(mapped), Filtered::V4(0x0a01_0203));
    assert_eq!(Filtered::backoff(mapped), Filtered::V4(0x0a01_0203));
    let v6: IpAddr = "2001:db8:1:2::7".parse().expect("v6");
    assert_eq!(
        Filtered::address(v6),
        Filtered::V6(0x2001_0db8_0001_0002_0000_0000_0000_0007)
    );
    let key: IpAddr = "2001:db8:1:2::".parse().expect("a /64 key");
    assert_eq!(
        Filtered::backoff(key),
        Filtered::V6Prefix(0x2001_0db8_0001_0002)
    );
}

#[test]
fn the_program_is_bounded_by_max_filtered_and_every_jump_stays_inside_it() {
    let many: BTreeSet<Filtered> = (0..1000u32)
        .map(Filtered::V4)
        .chain((0..1000u128).map(Filtered::V6))
        .collect();
    let code = program(&many);
    // 11 header, 2 per IPv4 peer (all of them sort first), an accept each block.
    assert_eq!(code.len(), 11 + 1 + 2 * MAX_FILTERED + 2);
    assert!(code.len() <= libc::BPF_MAXINSNS as usize);
    let mixed: BTreeSet<Filtered> = [Filtered::V4(1), Filtered::V6Prefix(2), Filtered::V6(3)]
        .into_iter()
        .collect();
    let code = program(&mixed);
    for (pc, insn) in code.iter().enumerate() {
        let class = u32::from(insn.code) & 0x07;
        if class == BPF_JMP {
            let targets = if u32::from(insn.code) & 0xf0 == BPF_JA {
                vec![insn.k as usize]
            } else {
                vec![usize::from(insn.jt), usize::from(insn.jf)]
            };
            for offset in targets {
                assert!(
                    pc + 1 + offset < code.len(),
                    "jump at {pc} leaves the program"
                );
            }
        }
    }
    let last = code.last().expect("an instruction");
    assert_eq!(
        (u32::from(last.code), last.k),
        (BPF_RET | BPF_K, ACCEPT),
        "anything not matched is accepted"
    );
}
