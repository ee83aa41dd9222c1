//! A small client for a running agent's HTTP API (`status --from URL`): plain HTTP/1.1 `GET` of a
//! JSON document, with a time limit. Errors say which URL failed and how; a problem+json answer
//! is reported by its `detail`.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::{Uri, body::Bytes};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::de::DeserializeOwned;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("--from {0:?}: expected an http:// URL such as http://127.0.0.1:9820")]
    Url(String),
    #[error("GET {url}: {detail}")]
    Request { url: String, detail: String },
    #[error("GET {url}: HTTP {status}: {detail}")]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("GET {url}: the answer is not the expected JSON: {detail}")]
    Json { url: String, detail: String },
}

/// The base URL of an agent, validated: `http://host:port` with an optional path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUrl(String);

impl AgentUrl {
    pub fn parse(text: &str) -> Result<AgentUrl, ClientError> {
        let uri: Uri = text
            .parse()
            .map_err(|_| ClientError::Url(text.to_owned()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() || uri.query().is_some() {
            return Err(ClientError::Url(text.to_owned()));
        }
        Ok(AgentUrl(text.trim_end_matches('/').to_owned()))
    }

    /// The URL of `path` (which starts with `/`) on this agent.
    pub fn join(&self, path: &str) -> String {
        format!("{}{path}", self.0)
    }
}

/// `GET base + path` and decode the JSON answer.
pub fn get_json<T: DeserializeOwned>(base: &AgentUrl, path: &str) -> Result<T, ClientError> {
    let url = base.join(path);
    let request_error = |detail: String| ClientError::Request {
        url: url.clone(),
        detail,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| request_error(format!("starting the I/O runtime: {e}")))?;
    let uri: Uri = url.parse().map_err(|_| ClientError::Url(base.0.clone()))?;
    let (status, body) = runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let response = tokio::time::timeout(TIMEOUT, client.get(uri))
            .await
            .map_err(|_| request_error(format!("no answer within {TIMEOUT:?}")))?
            .map_err(|e| request_error(describe(&e)))?;
        let status = response.status();
        let body = tokio::time::timeout(TIMEOUT, response.into_body().collect())
            .await
            .map_err(|_| request_error(format!("the body did not arrive within {TIMEOUT:?}")))?
            .map_err(|e| request_error(e.to_string()))?
            .to_bytes();
        Ok::<_, ClientError>((status, body))
    })?;
    if !status.is_success() {
        let detail = problem_detail(&body);
        return Err(ClientError::Status {
            url,
            status: status.as_u16(),
            detail,
        });
    }
    serde_json::from_slice(&body).map_err(|e| ClientError::Json {
        url,
        detail: e.to_string(),
    })
}

/// The `detail` of an agent's problem document (RFC 9457), else the body's first 200 bytes.
pub fn problem_detail(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("detail")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

/// The error and its causes on one line (hyper's own message is only "client error (Connect)").
fn describe(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_are_accepted() {
        let url = AgentUrl::parse("http://127.0.0.1:9820/").expect("valid");
        assert_eq!(
            url.join("/v1/hugepages"),
            "http://127.0.0.1:9820/v1/hugepages"
        );
        for bad in [
            "127.0.0.1:9820",
            "https://node:9820",
            "http://",
            "ftp://x",
            "http://h/?q=1",
        ] {
            assert_eq!(
                AgentUrl::parse(bad).unwrap_err().to_string(),
                format!("--from {bad:?}: expected an http:// URL such as http://127.0.0.1:9820")
            );
        }
    }

    #[test]
    fn a_closed_port_is_an_error_naming_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let url = AgentUrl::parse(&format!("http://127.0.0.1:{port}")).expect("valid");
        let err = get_json::<serde_json::Value>(&url, "/v1/hugepages")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("GET http://127.0.0.1:{port}/v1/hugepages: ")),
            "{err}"
        );
        assert!(err.contains("onnection refused"), "{err}");
    }
}
