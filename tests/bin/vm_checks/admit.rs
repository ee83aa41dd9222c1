//! The checks' admissions: one JSON body through `POST /v1/admit` (answered 200 with a verdict,
//! else the check fails naming the status and body), and the UIDs of their pods, made from the
//! pod's name so that the same name always reserves as the same pod.

use hugepage_agent_tests::http;
use serde_json::Value;

/// The verdict of `POST /v1/admit` with `body` (`what` names the request in an error).
pub fn post(port: u16, what: &str, body: &Value) -> Result<Value, String> {
    let (status, text) = http(
        port,
        "POST",
        "/v1/admit",
        Some("application/json"),
        &body.to_string(),
    );
    if status != 200 {
        return Err(format!("POST /v1/admit {what}: {status} {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("POST /v1/admit {what}: JSON: {e}: {text}"))
}

/// A UUID as the API server assigns one, distinct for each pod name.
pub fn pod_uid(name: &str) -> String {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("00000000-0000-4000-8000-{:012x}", hash & 0xffff_ffff_ffff)
}
