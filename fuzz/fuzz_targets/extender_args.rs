//! The scheduler extender's `ExtenderArgs` (`webhook/extender.rs`, `webhook/scheduler.rs`), any
//! bytes as the body of `filter` or `prioritize`. The pod reads or is refused with a message; a
//! pod that reads gives a JSON body for its agent; every node object reads as a candidate under
//! its own name, or is refused naming its index.
#![no_main]

use hugepage_agent::webhook::{extender::ExtenderArgs, node, pod};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(args) = serde_json::from_slice::<ExtenderArgs>(data) else {
        return;
    };
    match pod::read(args.pod.as_deref()) {
        Ok(read) => {
            let body: serde_json::Value =
                serde_json::from_slice(&read.body).expect("the body for the agent is JSON");
            assert!(body.is_object());
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    for (i, item) in args.nodes.iter().flat_map(|l| l.items.iter()).enumerate() {
        match node::candidate(i, item, 9820) {
            Ok(c) => {
                assert_eq!(node::name_of(item), Some(c.name.clone()));
                if let Err(why) = &c.agent {
                    assert!(!why.is_empty());
                }
            }
            Err(e) => assert!(e.to_string().contains(&format!("items[{i}]"))),
        }
    }
});
