use std::io::Read;

use hugepage_agent_common::tasks::{Held, NAME_BYTES, kind};

use super::*;

fn record(tgid: u32) -> Held {
    Held {
        kind: kind::MAPPING,
        tgid,
        fd: 0,
        dev: 0x2d,
        flags: 0,
        ipc_ns: 0,
        ino: u64::from(tgid) * 10,
        start: 0x7f00_0000_0000,
        end: 0x7f00_0020_0000,
        page_size: 2 << 20,
        held_bytes: 2 << 20,
        name: [b'x'; NAME_BYTES],
    }
}

fn bytes(records: &[Held]) -> Vec<u8> {
    records
        .iter()
        .flat_map(|r| {
            // SAFETY: `Held` is plain integers and bytes, with no padding.
            unsafe {
                std::slice::from_raw_parts((r as *const Held).cast::<u8>(), size_of::<Held>())
            }
            .to_vec()
        })
        .collect()
}

/// Gives its bytes `step` at a time, as a kernel read that stops mid-record may.
struct Trickle(Vec<u8>, usize);

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.min(buf.len()).min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0.drain(..n);
        Ok(n)
    }
}

#[test]
fn records_split_across_reads_are_put_back_together() {
    let sent: Vec<Held> = (1..=200).map(record).collect();
    let mut got = Records::default();
    read_records(Trickle(bytes(&sent), 37), &mut got).expect("read");
    assert_eq!(got.held, sent);
    assert!(!got.truncated);
}

#[test]
fn a_cut_record_is_an_error_and_a_flood_is_cut_at_the_bound() {
    let mut cut = bytes(&[record(1), record(2)]);
    cut.truncate(cut.len() - 5);
    let err = read_records(Trickle(cut, 4096), &mut Records::default()).expect_err("cut");
    assert!(
        err.to_string().contains("after the last whole record"),
        "{err}"
    );

    let flood: Vec<Held> = (0..MAX_RECORDS as u32 + 10).map(record).collect();
    let mut got = Records::default();
    read_records(Trickle(bytes(&flood), 1 << 20), &mut got).expect("read");
    assert_eq!(got.held.len(), MAX_RECORDS);
    assert!(got.truncated);
}
