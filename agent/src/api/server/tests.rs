use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::Arc,
};

use axum::{Router, routing::get};
use tokio::sync::Notify;

use super::*;

/// `GET path` over a new connection; the answer's body.
fn get_body(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    // A request nobody serves fails the test instead of hanging it.
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// `/slow` blocks its thread until `release` is notified (`entered` says it has started);
/// `/` answers with the name of the thread that served it.
fn router(entered: Arc<Notify>, release: Arc<std::sync::Barrier>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { thread::current().name().unwrap_or("?").to_owned() }),
        )
        .route(
            "/slow",
            get(move || {
                entered.notify_one();
                // Blocks the thread's runtime, as a slow synchronous step would.
                release.wait();
                async { "done" }
            }),
        )
}

/// A server of `threads` threads, one of them blocked in a `/slow` request.
struct Blocked {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: Server,
    /// Lets the `/slow` request finish.
    release: Arc<std::sync::Barrier>,
    /// The `/slow` request's answer.
    slow: tokio::task::JoinHandle<String>,
}

async fn blocked(threads: usize) -> Blocked {
    let entered = Arc::new(Notify::new());
    let release = Arc::new(std::sync::Barrier::new(2));
    let bound = Server::bind(any_port()).expect("bind");
    let addr = bound.addr();
    let (stop, stopped) = watch::channel(false);
    let app = router(Arc::clone(&entered), Arc::clone(&release));
    let server = Server::start(bound, threads, app, stopped).expect("start");
    let slow = tokio::task::spawn_blocking(move || get_body(addr, "/slow"));
    entered.notified().await;
    Blocked {
        addr,
        stop,
        server,
        release,
        slow,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_thread_blocked_in_a_request_leaves_new_connections_to_the_others() {
    let Blocked {
        addr,
        stop,
        server,
        release,
        slow,
    } = blocked(2).await;
    let blocked = tokio::task::spawn_blocking(move || {
        (0..5)
            .map(|_| get_body(addr, "/"))
            .collect::<std::collections::BTreeSet<_>>()
    })
    .await
    .expect("client");
    assert_eq!(
        blocked.len(),
        1,
        "one thread answered while the other was blocked: {blocked:?}"
    );
    assert!(
        blocked.iter().all(|name| name.starts_with("http-api-")),
        "{blocked:?}"
    );
    release.wait();
    assert_eq!(slow.await.expect("client"), "done");
    stop.send(true).expect("stop");
    assert_eq!(
        server.stopped(Duration::from_secs(5)).await,
        Drained::default()
    );
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens on {addr} once drained"
    );
}

#[tokio::test]
async fn a_port_another_socket_holds_is_refused_even_if_it_allows_sharing() {
    // A second agent's listener, or anything that set SO_REUSEPORT to share the port.
    let other = TcpSocket::new_v4().expect("socket");
    other.set_reuseport(true).expect("SO_REUSEPORT");
    other.set_reuseaddr(true).expect("SO_REUSEADDR");
    other.bind(any_port()).expect("bind");
    let addr = other.local_addr().expect("address");
    let _held = other.listen(8).expect("listen");
    let err = Server::bind(addr).expect_err("the port is taken");
    assert!(
        err.to_string().starts_with(&format!("--listen {addr}: ")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_request_still_running_at_the_deadline_is_reported_busy() {
    let Blocked {
        stop,
        server,
        release,
        slow,
        ..
    } = blocked(1).await;
    stop.send(true).expect("stop");
    let drained = server.stopped(Duration::from_millis(200)).await;
    assert_eq!(
        drained,
        Drained {
            busy: 1,
            failed: None
        }
    );
    release.wait();
    assert_eq!(
        slow.await.expect("client"),
        "done",
        "the request in flight is answered"
    );
}
