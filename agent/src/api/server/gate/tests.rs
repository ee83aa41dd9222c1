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
    // 12 before the IPv4 block, 2 per IPv4 peer (all of them sort first), its accept, the
    // 8 that keep the IPv6 source, the accept.
    assert_eq!(code.len(), 12 + 2 * MAX_FILTERED + 1 + 8 + 1);
    let mixed: BTreeSet<Filtered> = [Filtered::V4(1), Filtered::V6Prefix(2), Filtered::V6(3)]
        .into_iter()
        .collect();
    let code = program(&mixed);
    for (pc, insn) in code.iter().enumerate() {
        if u32::from(insn.code) & 0x07 == BPF_JMP {
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
}

/// Runs `code` as the kernel runs a classic socket filter on a segment whose network header is
/// `net` and whose TCP header is `tcp` (where the filter's data starts): its return value. A
/// load outside the packet ends it with 0, as the kernel's does.
fn run(code: &[sock_filter], net: &[u8], tcp: &[u8]) -> u32 {
    let load = |k: u32, size: usize| -> Option<u32> {
        let signed = k as i32;
        let (bytes, at) = if signed < 0 {
            (net, usize::try_from(signed - SKF_NET_OFF).ok()?)
        } else {
            (tcp, k as usize)
        };
        let taken = bytes.get(at..at + size)?;
        Some(taken.iter().fold(0, |word, b| word << 8 | u32::from(*b)))
    };
    let (mut a, mut memory, mut pc) = (0u32, [0u32; 16], 0usize);
    loop {
        let insn = code.get(pc).expect("the program ends with a return");
        pc += 1;
        let k = insn.k;
        match u32::from(insn.code) {
            c if c == BPF_LD | BPF_B | BPF_ABS => match load(k, 1) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_LD | BPF_W | BPF_ABS => match load(k, 4) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_LD | BPF_MEM => a = memory[k as usize],
            c if c == BPF_ST => memory[k as usize] = a,
            c if c == BPF_ALU | BPF_AND | BPF_K => a &= k,
            c if c == BPF_ALU | BPF_RSH | BPF_K => a >>= k,
            c if c == BPF_JMP | BPF_JA => pc += k as usize,
            c if c == BPF_JMP | BPF_JEQ | BPF_K => {
                pc += usize::from(if a == k { insn.jt } else { insn.jf });
            }
            c if c == BPF_RET | BPF_K => return k,
            other => panic!("an instruction the program should not have: {other:#x}"),
        }
    }
}

fn ipv4(source: &str) -> Vec<u8> {
    let mut header = vec![0u8; 20];
    header[0] = 0x45;
    let ip: std::net::Ipv4Addr = source.parse().expect("IPv4");
    header[12..16].copy_from_slice(&ip.octets());
    header
}

fn ipv6(source: &str) -> Vec<u8> {
    let mut header = vec![0u8; 40];
    header[0] = 0x60;
    let ip: std::net::Ipv6Addr = source.parse().expect("IPv6");
    header[8..24].copy_from_slice(&ip.octets());
    header
}

fn tcp(flags: u8) -> Vec<u8> {
    let mut header = vec![0u8; 20];
    header[13] = flags;
    header
}

const SYN_ONLY: u8 = 0x02;
const ACK: u8 = 0x10;

#[test]
fn the_program_drops_only_the_bare_syns_of_the_peers_it_was_given() {
    let peers: BTreeSet<Filtered> = [
        Filtered::address("10.0.0.1".parse().expect("v4")),
        Filtered::backoff("2001:db8:1:2::".parse().expect("a /64")),
        Filtered::address("2001:db8::7".parse().expect("v6")),
    ]
    .into_iter()
    .collect();
    let code = program(&peers);
    let cases: [(Vec<u8>, u8, u32); 11] = [
        (ipv4("10.0.0.1"), SYN_ONLY, DROP),
        // SYN with ECN's flags set is still a bare SYN.
        (ipv4("10.0.0.1"), SYN_ONLY | 0xc0, DROP),
        (ipv4("10.0.0.1"), ACK, ACCEPT),
        (ipv4("10.0.0.1"), SYN_ONLY | ACK, ACCEPT),
        (ipv4("10.0.0.2"), SYN_ONLY, ACCEPT),
        (ipv6("2001:db8:1:2::99"), SYN_ONLY, DROP),
        (ipv6("2001:db8:1:3::99"), SYN_ONLY, ACCEPT),
        (ipv6("2001:db8::7"), SYN_ONLY, DROP),
        (ipv6("2001:db8::7"), ACK, ACCEPT),
        (ipv6("2001:db8::8"), SYN_ONLY, ACCEPT),
        // 10.0.0.1's bytes as the first of an IPv6 source: another address.
        (ipv6("a00:1::"), SYN_ONLY, ACCEPT),
    ];
    for (net, flags, expected) in cases {
        assert_eq!(
            run(&code, &net, &tcp(flags)),
            expected,
            "{net:02x?} flags {flags:#x}"
        );
    }
    let none = program(&BTreeSet::new());
    assert_eq!(run(&none, &ipv4("10.0.0.1"), &tcp(SYN_ONLY)), ACCEPT);
    assert_eq!(run(&none, &ipv6("2001:db8::7"), &tcp(SYN_ONLY)), ACCEPT);
}

#[test]
fn the_last_of_max_filtered_peers_is_dropped_and_the_next_is_not() {
    let peers: BTreeSet<Filtered> = (1..=MAX_FILTERED as u128 + 1)
        .map(|n| Filtered::V6(0x2001_0db8 << 96 | n))
        .collect();
    let code = program(&peers);
    let source = |n: usize| format!("2001:db8::{n:x}");
    assert_eq!(run(&code, &ipv6(&source(1)), &tcp(SYN_ONLY)), DROP);
    assert_eq!(
        run(&code, &ipv6(&source(MAX_FILTERED)), &tcp(SYN_ONLY)),
        DROP
    );
    assert_eq!(
        run(&code, &ipv6(&source(MAX_FILTERED + 1)), &tcp(SYN_ONLY)),
        ACCEPT
    );
}
