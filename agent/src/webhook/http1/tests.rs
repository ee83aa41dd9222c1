use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

use super::*;

const POST: Post<'static> = Post {
    method: "POST",
    target: "/v1/admit?dryRun=true",
    host: "hugepage-agent",
    headers: &[(
        "traceparent",
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )],
    body: b"{\"kind\":\"Pod\"}",
};

/// An answer sent in `pieces` by a peer that then closes its side (or keeps it open when
/// `linger`); the exchange's result and what the peer received.
async fn against(pieces: &[&[u8]], linger: bool) -> (Result<Answer, Http1Error>, String) {
    let (mut client, mut peer) = duplex(64 * 1024);
    let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
    let peer_task = tokio::spawn(async move {
        let mut got = vec![0u8; 4096];
        let n = peer.read(&mut got).await.expect("the request");
        for piece in pieces {
            peer.write_all(&piece).await.expect("write");
            tokio::task::yield_now().await;
        }
        if linger {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        String::from_utf8_lossy(&got[..n]).into_owned()
    });
    let result = exchange(&mut client, &POST, 1024).await;
    let received = peer_task.await.expect("peer");
    (result, received)
}

#[tokio::test]
async fn the_request_is_one_post_with_length_type_host_and_the_extra_headers() {
    let (result, received) =
        against(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"], true).await;
    assert_eq!(
        received,
        "POST /v1/admit?dryRun=true HTTP/1.1\r\nhost: hugepage-agent\r\ncontent-type: application/json\r\ncontent-length: 14\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n{\"kind\":\"Pod\"}"
    );
    assert_eq!(
        result.expect("an answer"),
        Answer {
            status: 200,
            body: b"{}".to_vec(),
            reusable: true
        }
    );
}

#[tokio::test]
async fn an_answer_in_many_pieces_after_an_interim_one_is_read_whole() {
    let (result, _) = against(
        &[
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 4",
            b"03 Forbidden\r\nCont",
            b"ent-Length:  5 \r\nconnection: keep-alive\r\n\r\nab",
            b"cde",
        ],
        true,
    )
    .await;
    assert_eq!(
        result.expect("an answer"),
        Answer {
            status: 403,
            body: b"abcde".to_vec(),
            reusable: true
        }
    );
}

#[tokio::test]
async fn close_http_1_0_and_bytes_after_the_answer_make_the_connection_not_reusable() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nconnection: Keep-Alive, close\r\ncontent-length: 0\r\n\r\n"[..],
        b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxHTTP/1.1",
    ] {
        let (result, _) = against(&[answer], true).await;
        let answer = result.expect("an answer");
        assert_eq!(answer.status, 200);
        assert!(!answer.reusable, "{answer:?}");
        assert!(answer.body.len() <= 1);
    }
}

#[tokio::test]
async fn a_close_before_any_answer_is_unanswered_and_later_ones_say_where() {
    let (result, _) = against(&[], false).await;
    assert!(
        matches!(&result, Err(Http1Error::Unanswered(m)) if m.contains("closed")),
        "{result:?}"
    );
    let (result, _) = against(&[b"HTTP/1.1 200 OK\r\n"], false).await;
    assert!(
        matches!(result, Err(Http1Error::ClosedInHead)),
        "{result:?}"
    );
    let (result, _) = against(
        &[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"],
        false,
    )
    .await;
    let err = result.expect_err("truncated");
    assert_eq!(
        err.to_string(),
        "the connection closed after 3 of the answer's 10 body bytes"
    );
}

#[tokio::test]
async fn answers_without_a_length_or_over_the_limit_or_garbled_are_refused_by_name() {
    for (answer, says) in [
        (
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"[..],
            "no Content-Length (agents answer with one), and this one is Transfer-Encoding",
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n{}", "no Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2x\r\n\r\n{}",
            "Content-Length is not a length: \"2x\"",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
            "Content-Length is not a length: \"3\"",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 1025\r\n\r\n",
            "body of 1025 bytes is over the limit of 1024",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "not a length",
        ),
        (b"\x16\x03\x01garbage\r\n\r\n", "malformed"),
        // Found by the fuzz target `http1_answer`: httparse reads `000` as status 0, which was
        // taken for a final answer.
        (
            b"HTTP/1.1 000 OK\r\ncontent-length: 2\r\n\r\n{}",
            "status 000 is not an HTTP status",
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 042 OK\r\ncontent-length: 0\r\n\r\n",
            "status 042 is not an HTTP status",
        ),
    ] {
        let (result, _) = against(&[answer], true).await;
        let err = result.expect_err("refused");
        assert!(err.to_string().contains(says), "{err} should say {says}");
    }
}

#[tokio::test]
async fn a_head_that_never_ends_is_refused_at_its_limit() {
    let long = vec![b'a'; MAX_HEAD + 10];
    let mut answer = b"HTTP/1.1 200 OK\r\nx-filler: ".to_vec();
    answer.extend_from_slice(&long);
    let (result, _) = against(&[&answer], true).await;
    assert!(
        matches!(result, Err(Http1Error::HeadTooLarge)),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_204_needs_no_length() {
    let (result, _) = against(&[b"HTTP/1.1 204 No Content\r\n\r\n"], true).await;
    assert_eq!(
        result.expect("an answer"),
        Answer {
            status: 204,
            body: Vec::new(),
            reusable: true
        }
    );
}
