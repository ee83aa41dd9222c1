//! The reservations file (`admission/reservations.rs`). Any bytes as the file: one that loads
//! (its checksum matches) keeps, after the identifier check, the reservations that written again
//! load back the same; a refused one says why. When the first byte is odd, the rest is read as a
//! list of reservations and written as the agent writes its file, which must then load back
//! whole (the checksum cannot stop the mutations there).
#![no_main]

use std::collections::BTreeMap;

use hugepage_agent::admission::reservations::{Reservation, check_identifiers, file_text, parse};
use libfuzzer_sys::fuzz_target;

/// What `Store::open` keeps of a list: the ones whose pod names pass, by id.
fn kept(list: Vec<Reservation>) -> BTreeMap<String, Reservation> {
    let mut kept = BTreeMap::new();
    for r in list {
        match check_identifiers(&r) {
            Ok(()) => {
                kept.insert(r.id.clone(), r);
            }
            Err(why) => assert!(!why.is_empty()),
        }
    }
    kept
}

fn round_trip(list: Vec<Reservation>) {
    let entries = kept(list);
    let refs: Vec<&Reservation> = entries.values().collect();
    let text = file_text(&refs);
    let again = parse(&text).unwrap_or_else(|why| {
        panic!(
            "our own file is refused: {why}\n{}",
            String::from_utf8_lossy(&text)
        )
    });
    assert_eq!(
        kept(again),
        entries,
        "the reservations changed when written"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first & 1 == 1 {
        if let Ok(list) = serde_json::from_slice::<Vec<Reservation>>(rest) {
            round_trip(list);
        }
        return;
    }
    match parse(rest) {
        Ok(list) => round_trip(list),
        Err(why) => assert!(!why.is_empty()),
    }
});
