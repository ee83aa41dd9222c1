//! One HTTP/1.1 exchange with a node's agent on a connection the caller owns: the request written
//! in one write, the answer read until its `Content-Length` is complete. The webhook keeps a
//! connection to every agent it asks, a thousand on a large cluster, so a connection must cost
//! no more than its TLS state while it waits: nothing here outlives the exchange (hyper's client
//! keeps about 34 KiB per idle connection: its dispatch channel's blocks, an 8 KiB head buffer
//! and its read buffer, which is what put the webhook over its memory target).
//!
//! The answer's head is parsed by `httparse` (hyper's parser). Agents answer with a
//! `Content-Length` always; an answer without one (chunked, or ended by the close) is refused
//! and so is one whose body is over the caller's limit. An interim `1xx` answer is skipped. The
//! connection may carry the next request ([`Answer::reusable`]) only when the answer was
//! HTTP/1.1, did not ask to close, and nothing followed it.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The most an answer's head may be.
pub const MAX_HEAD: usize = 16 * 1024;
/// How many header lines an answer's head may have.
const MAX_HEADERS: usize = 32;
/// The read buffer's first size: an agent's verdict and its head fit.
const FIRST_READ: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum Http1Error {
    /// The request could not be written, or the connection ended or failed before a byte of
    /// the answer came: on a reused connection, the agent had closed it (the caller may send
    /// the request again on a new one).
    #[error("no answer: {0}")]
    Unanswered(String),
    #[error("reading the answer: {0}")]
    Read(#[source] io::Error),
    #[error("the connection closed within the answer's head")]
    ClosedInHead,
    #[error("the answer's head is malformed: {0}")]
    Head(#[source] httparse::Error),
    #[error("the answer's status {0:03} is not an HTTP status (100 to 999)")]
    Status(u16),
    #[error("the answer's head is over {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("the answer has no Content-Length (agents answer with one){0}")]
    NoLength(&'static str),
    #[error("the answer's Content-Length is not a length: {0:?}")]
    BadLength(String),
    #[error("the answer's body of {length} bytes is over the limit of {limit}")]
    TooLarge { length: u64, limit: usize },
    #[error("the connection closed after {got} of the answer's {length} body bytes")]
    Truncated { got: usize, length: usize },
}

/// A request: `POST` of a JSON body (or a `DELETE`, its body empty).
#[derive(Debug)]
pub struct Post<'a> {
    /// `POST` or `DELETE`.
    pub method: &'a str,
    /// The path and query (`/v1/admit?dryRun=true`).
    pub target: &'a str,
    /// The `Host` header's value.
    pub host: &'a str,
    /// Further header lines (the trace context).
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body: &'a [u8],
}

/// An answer read in full.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    /// Whether the connection may carry the next request.
    pub reusable: bool,
}

/// Writes `post` on `io` and reads its answer, whose body may be at most `limit` bytes.
pub async fn exchange<S>(io: &mut S, post: &Post<'_>, limit: usize) -> Result<Answer, Http1Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let request = request(post);
    let sent = async {
        io.write_all(&request).await?;
        io.flush().await
    };
    sent.await
        .map_err(|e| Http1Error::Unanswered(format!("sending the request: {e}")))?;
    drop(request);
    read_answer(io, limit).await
}

/// The request's bytes: head and body, for one write.
fn request(post: &Post<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + post.body.len());
    out.extend_from_slice(post.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(post.target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(post.host.as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
    out.extend_from_slice(post.body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in post.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(post.body);
    out
}

/// What an answer's head says.
struct Head {
    /// The head's length in bytes.
    len: usize,
    status: u16,
    /// The body's length.
    length: usize,
    keep_alive: bool,
}

async fn read_answer<S>(io: &mut S, limit: usize) -> Result<Answer, Http1Error>
where
    S: AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(FIRST_READ);
    let mut received = 0usize;
    let head = loop {
        match parse_head(&buf, limit)? {
            Parsed::Final(head) => break head,
            Parsed::Interim(len) => {
                buf.drain(..len);
                continue;
            }
            Parsed::Partial if buf.len() >= MAX_HEAD => return Err(Http1Error::HeadTooLarge),
            Parsed::Partial => {}
        }
        if buf.len() == buf.capacity() {
            buf.reserve(FIRST_READ.min(MAX_HEAD - buf.len()));
        }
        let read = io.read_buf(&mut buf).await;
        match read {
            Ok(0) if received == 0 => {
                return Err(Http1Error::Unanswered(
                    "the agent closed the connection".to_owned(),
                ));
            }
            Ok(0) => return Err(Http1Error::ClosedInHead),
            Ok(n) => received += n,
            Err(e) if received == 0 => return Err(Http1Error::Unanswered(e.to_string())),
            Err(e) => return Err(Http1Error::Read(e)),
        }
    };
    let end = head.len + head.length;
    if buf.len() < end {
        buf.reserve_exact(end - buf.len());
    }
    while buf.len() < end {
        let n = io.read_buf(&mut buf).await.map_err(Http1Error::Read)?;
        if n == 0 {
            return Err(Http1Error::Truncated {
                got: buf.len() - head.len,
                length: head.length,
            });
        }
    }
    let reusable = head.keep_alive && buf.len() == end;
    buf.truncate(end);
    buf.drain(..head.len);
    Ok(Answer {
        status: head.status,
        body: buf,
        reusable,
    })
}

enum Parsed {
    /// More bytes are needed.
    Partial,
    /// A `1xx` answer of this many bytes, to skip.
    Interim(usize),
    Final(Head),
}

fn parse_head(buf: &[u8], limit: usize) -> Result<Parsed, Http1Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf).map_err(Http1Error::Head)? {
        httparse::Status::Partial => return Ok(Parsed::Partial),
        httparse::Status::Complete(len) => len,
    };
    let status = response.code.unwrap_or_default();
    // httparse reads any three digits; `000` to `099` are no status (hyper refuses them too).
    if status < 100 {
        return Err(Http1Error::Status(status));
    }
    if (100..200).contains(&status) {
        return Ok(Parsed::Interim(len));
    }
    let mut length = None;
    let mut keep_alive = response.version == Some(1);
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("content-length") {
            let text = String::from_utf8_lossy(header.value);
            let value: u64 = text
                .trim()
                .parse()
                .map_err(|_| Http1Error::BadLength(text.clone().into_owned()))?;
            if length.is_some_and(|l| l != value) {
                return Err(Http1Error::BadLength(text.into_owned()));
            }
            length = Some(value);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Http1Error::NoLength(", and this one is Transfer-Encoding"));
        } else if header.name.eq_ignore_ascii_case("connection")
            && header
                .value
                .split(|b| *b == b',')
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
        {
            keep_alive = false;
        }
    }
    let length = match (length, status) {
        (Some(length), _) => length,
        (None, 204 | 304) => 0,
        (None, _) => return Err(Http1Error::NoLength("")),
    };
    let length = usize::try_from(length)
        .ok()
        .filter(|l| *l <= limit)
        .ok_or(Http1Error::TooLarge { length, limit })?;
    Ok(Parsed::Final(Head {
        len,
        status,
        length,
        keep_alive,
    }))
}

#[cfg(test)]
mod tests;
