//! The webhook's `AdmissionReview` (`webhook/review.rs`, `webhook/admission.rs`), any bytes as
//! the body of `POST /admission/validate`. What a request asks to judge is well formed (a
//! binding names its namespace, pod and node; a placed pod carries the node it names); a request
//! that cannot be judged is refused naming the field (`request.…`); the pod of a placed pod reads
//! or is refused with a message.
#![no_main]

use hugepage_agent::webhook::{
    admission::{Subject, subject},
    pod,
    review::AdmissionReview,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(review) = serde_json::from_slice::<AdmissionReview>(data) else {
        return;
    };
    let Some(request) = review.request else {
        return;
    };
    match subject(&request) {
        Ok(Subject::Binding {
            namespace,
            pod,
            uid,
            node,
        }) => {
            assert!(!namespace.is_empty() && !pod.is_empty() && !node.is_empty());
            assert!(uid.is_none_or(|u| !u.is_empty()), "an empty UID is none");
        }
        Ok(Subject::Placed { pod: value, node }) => {
            assert!(!node.is_empty());
            let parsed: serde_json::Value =
                serde_json::from_str(value.get()).expect("a placed pod is JSON");
            assert_eq!(
                parsed.pointer("/spec/nodeName").and_then(|n| n.as_str()),
                Some(node.as_str())
            );
            match pod::read(Some(&*value)) {
                Ok(read) => {
                    let body: serde_json::Value =
                        serde_json::from_slice(&read.body).expect("the body for the agent is JSON");
                    assert!(body.is_object());
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
        Ok(Subject::Pass(why)) => assert!(!why.is_empty()),
        Err(why) => assert!(why.starts_with("request."), "{why:?} names no field"),
    }
});
