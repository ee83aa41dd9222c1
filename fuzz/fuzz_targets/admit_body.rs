//! `POST /v1/admit`'s body, both forms (the short form and a whole `v1.Pod`), as
//! `api::admit::parse` reads it: the first byte picks the content type and the container limit,
//! the rest is the body. A body that parses has no more containers than the limit; a refused one
//! is a 4xx problem whose detail is not empty and, when it names a field, names one (the empty
//! key `""` being one).
#![no_main]

use hugepage_agent::api::admit::parse;
use libfuzzer_sys::fuzz_target;

const TYPES: [Option<&str>; 4] = [
    Some("application/json"),
    Some("Application/JSON; charset=utf-8"),
    Some("text/plain"),
    None,
];

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let content_type = TYPES[usize::from(first & 3)];
    let max_containers = usize::from(first >> 2);
    match parse(content_type, body, max_containers) {
        Ok(parsed) => {
            assert!(
                content_type
                    .is_some_and(|t| t.to_ascii_lowercase().starts_with("application/json"))
            );
            assert!(
                parsed.containers() <= max_containers,
                "{} containers over {max_containers}",
                parsed.containers()
            );
        }
        Err(e) => {
            assert!(
                (400..500).contains(&e.status_code),
                "status {}",
                e.status_code
            );
            assert!(!e.detail.trim().is_empty(), "an empty detail: {e:?}");
            if let Some(field) = &e.field {
                // Empty only when the key at fault is the empty one (`{"": …}`).
                let empty_key = body.windows(2).any(|w| w == b"\"\"");
                assert!(!field.is_empty() || empty_key, "an empty field: {e:?}");
            }
        }
    }
});
