//! A client of the agent's map watch (`GET /v1/hugepages?watch=true`) as any HTTP/1.1 client
//! reads it: the status and headers, then the chunked body split into its JSON events, one a
//! line. Plain TCP (the agent in these tests serves `/v1` without TLS).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use serde_json::Value;

/// A watch's response read off the socket: its status, then its events.
pub struct Watch {
    pub status: u16,
    headers: Vec<String>,
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl Watch {
    pub fn open(port: u16, query: &str) -> Watch {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            tcp,
            "GET /v1/hugepages?{query} HTTP/1.1\r\nHost: agent\r\nAccept: application/json\r\n\r\n"
        )
        .expect("send the request");
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        let mut reader = BufReader::new(tcp);
        let mut line = String::new();
        reader.read_line(&mut line).expect("the status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("a header");
            if header.trim().is_empty() {
                break;
            }
            headers.push(header.trim().to_ascii_lowercase());
        }
        Watch {
            status,
            headers,
            reader,
            pending: Vec::new(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find_map(|h| h.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    }

    /// The next event, within `within`; `None` when the stream ended.
    pub fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                return Some(serde_json::from_slice(&line).expect("a JSON event"));
            }
            assert!(Instant::now() < deadline, "no event within {within:?}");
            // One chunk: its size in hex, the data, CRLF; a size of 0 ends the body.
            let mut size = String::new();
            if self.reader.read_line(&mut size).expect("a chunk size") == 0 {
                // The connection closed (the agent stopped).
                return None;
            }
            let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
            if size == 0 {
                return None;
            }
            let mut data = vec![0; size + 2];
            self.reader.read_exact(&mut data).expect("a chunk");
            self.pending.extend_from_slice(&data[..size]);
        }
    }

    /// The next event that is not a heartbeat.
    pub fn next_state(&mut self, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self.next(left).expect("the stream goes on");
            if event["type"] != "BOOKMARK" {
                return event;
            }
        }
    }
}
