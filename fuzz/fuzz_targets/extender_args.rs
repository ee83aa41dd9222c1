//! The scheduler extender's `ExtenderArgs` (`webhook/extender.rs`, `webhook/scheduler.rs`), any
//! bytes as the body of `filter` or `prioritize`. The pod reads or is refused with a message; a
//! pod that reads gives a JSON body for its agent; of every node object only a name is read (its
//! addresses are the caller's, never dialled), and a Node that parses reads as a candidate under
//! that name, with an agent address or why there is none.
#![no_main]

use hugepage_agent::webhook::{extender::ExtenderArgs, node, pod};
use k8s_openapi::api::core::v1::Node;
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
    for item in args.nodes.iter().flat_map(|l| l.items.iter()) {
        let Some(name) = node::name_of(item) else {
            continue;
        };
        assert!(!name.is_empty());
        let Ok(object) = serde_json::from_str::<Node>(item.get()) else {
            continue;
        };
        let c = node::of_node(name.clone(), &object, 9820);
        assert_eq!(c.name, name);
        if let Err(why) = &c.agent {
            assert!(!why.is_empty());
        }
    }
});
