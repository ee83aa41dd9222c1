//! Kubernetes quantities (`agent/src/quantity.rs`): any text. A quantity that parses prints in
//! the canonical binary form and parses back to the same bytes; bytes and billionths agree
//! (bytes are the billionths rounded up); a refused text is named in the error.
#![no_main]

use hugepage_agent::quantity::{format_binary, parse_bytes, parse_nanos};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let quoted = format!("{text:?}");
    let bytes = parse_bytes(text);
    match &bytes {
        Ok(bytes) => {
            let printed = format_binary(*bytes);
            assert_eq!(
                parse_bytes(&printed),
                Ok(*bytes),
                "{quoted} -> {bytes} -> {printed:?}"
            );
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&quoted),
                "{message:?} does not name {quoted}"
            );
        }
    }
    match parse_nanos(text) {
        Ok(nanos) => {
            let whole = nanos.div_ceil(1_000_000_000);
            match u64::try_from(whole) {
                Ok(whole) => assert_eq!(bytes, Ok(whole), "{quoted}: {nanos} billionths"),
                Err(_) => assert!(bytes.is_err(), "{quoted}: {nanos} billionths"),
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&quoted),
                "{message:?} does not name {quoted}"
            );
        }
    }
});
