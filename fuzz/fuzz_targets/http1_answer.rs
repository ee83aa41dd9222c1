//! The webhook's reader of an agent's answer (`webhook/http1.rs`): `exchange` over an in-memory
//! duplex, any bytes as what the agent sends back (the first byte picks the size of the pieces
//! they arrive in, and the body limit), then the end of the connection. An answer read is a
//! final status with a body within the limit, and a reusable connection's body is the last of
//! what was sent (when it came in one piece); a refusal says why.
#![no_main]

use std::sync::OnceLock;

use hugepage_agent::webhook::http1::{Post, exchange};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, answer)) = data.split_first() else {
        return;
    };
    let piece = 1 + usize::from(first & 0x3f) * 17;
    let limit = [0, 16, 4096, 1 << 20][usize::from(first >> 6)];
    let post = Post {
        method: "POST",
        target: "/v1/admit?dryRun=true",
        host: "node-1:9820",
        headers: &[(
            "traceparent",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )],
        body: b"{\"pod\":{}}",
    };
    let (mut webhook, mut agent) = duplex(4096);
    let outcome = runtime().block_on(async {
        let agent_side = async move {
            for chunk in answer.chunks(piece) {
                if agent.write_all(chunk).await.is_err() {
                    return;
                }
            }
            let _ = agent.shutdown().await;
            // Drain the request so that the webhook's write never waits, then close.
            let mut sink = Vec::new();
            let _ = agent.read_to_end(&mut sink).await;
        };
        // The webhook's end closes as soon as the exchange is over (an agent still writing then
        // fails instead of waiting for a reader).
        let webhook_side = async move {
            let outcome = exchange(&mut webhook, &post, limit).await;
            drop(webhook);
            outcome
        };
        let (outcome, ()) = tokio::join!(webhook_side, agent_side);
        outcome
    });
    match outcome {
        Ok(a) => {
            assert!((200..1000).contains(&a.status), "status {:03}", a.status);
            assert!(a.body.len() <= limit, "{} bytes over {limit}", a.body.len());
            // Reusable means nothing followed the answer in what had arrived; when it came in
            // one piece that fits the pipe, that is everything sent.
            if a.reusable && answer.len() <= piece.min(4096) {
                assert!(
                    answer.ends_with(&a.body),
                    "a reusable answer's body is not the end of what was sent"
                );
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
