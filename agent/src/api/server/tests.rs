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

/// Answers with the name of the thread that served the request.
fn thread_name_router() -> Router {
    Router::new().route(
        "/",
        get(|| async { thread::current().name().unwrap_or("?").to_owned() }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn every_thread_accepts_on_the_one_port_and_all_drain() {
    let bound = Server::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let addr = bound.addr();
    let (stop, stopped) = watch::channel(false);
    let server = Server::start(bound, 2, thread_name_router(), stopped).expect("start");
    let served = tokio::task::spawn_blocking(move || {
        // The kernel spreads new connections over the two listeners by their ports: 40
        // connections all landing on one of two listeners would happen once in 2^39 runs.
        (0..40)
            .map(|_| get_body(addr, "/"))
            .collect::<std::collections::BTreeSet<_>>()
    })
    .await
    .expect("client");
    assert_eq!(
        served,
        ["http-api-0", "http-api-1"].map(String::from).into(),
        "both API threads answer on {addr}"
    );
    stop.send(true).expect("stop");
    assert!(matches!(
        server.stopped(Duration::from_secs(5)).await,
        Drained::All
    ));
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens on {addr} once drained"
    );
}

#[tokio::test]
async fn a_port_taken_by_another_socket_is_an_error_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address");
    let err = Server::bind(addr).expect_err("the port is taken");
    assert!(
        err.to_string().starts_with(&format!("--listen {addr}: ")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_request_still_running_at_the_deadline_is_reported_busy() {
    let release = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let (held, seen) = (Arc::clone(&release), Arc::clone(&entered));
    let router = Router::new().route(
        "/slow",
        get(move || {
            let (held, seen) = (Arc::clone(&held), Arc::clone(&seen));
            async move {
                seen.notify_one();
                held.notified().await;
                "done"
            }
        }),
    );
    let bound = Server::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let addr = bound.addr();
    let (stop, stopped) = watch::channel(false);
    let server = Server::start(bound, 1, router, stopped).expect("start");
    let client = tokio::task::spawn_blocking(move || get_body(addr, "/slow"));
    entered.notified().await;
    stop.send(true).expect("stop");
    let drained = server.stopped(Duration::from_millis(200)).await;
    assert!(matches!(drained, Drained::Busy(1)), "{drained:?}");
    release.notify_one();
    assert_eq!(
        client.await.expect("client"),
        "done",
        "the request in flight is answered"
    );
}
