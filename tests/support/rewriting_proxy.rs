//! An HTTP/1.1 proxy in front of a store emulator that rewrites each request
//! head on its way, answers untouched: to play a store that ignores the
//! conditions on its writes, as some S3-compatible stores do. It may also
//! answer a request itself instead of forwarding it: to play a store that
//! throttles.

use crate::stores::Endpoint;
use anyhow::{bail, Context, Result};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request's line and headers, as the client sent them.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// `PUT`, `GET`, …
    pub method: String,
    /// The path and query, as sent.
    pub target: String,
    /// Each header, in order, with its name as sent.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Drops every header called `name`; whether there was one.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.headers.len();
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.len() != before
    }

    /// Sets header `name` to `value`, replacing any.
    pub fn set(&mut self, name: &str, value: String) {
        self.remove(name);
        self.headers.push((name.to_string(), value));
    }

    fn encode(&self) -> Vec<u8> {
        let mut text = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        text.into_bytes()
    }
}

/// What the proxy does to each request head.
pub type Rewrite = Arc<dyn Fn(&mut RequestHead) + Send + Sync>;

/// An answer the proxy gives itself: its status line's code and reason,
/// its headers and its body.
#[derive(Debug, Clone)]
pub struct Canned {
    pub status: u16,
    pub reason: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Canned {
    fn encode(&self) -> Vec<u8> {
        let mut text = format!("HTTP/1.1 {} {}\r\n", self.status, self.reason);
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str(&format!("Content-Length: {}\r\n\r\n", self.body.len()));
        text.push_str(&self.body);
        text.into_bytes()
    }
}

/// Whether the proxy answers a request itself (`Some`) or forwards it.
pub type Answer = Arc<dyn Fn(&RequestHead) -> Option<Canned> + Send + Sync>;

/// A running proxy; it stops when dropped.
pub struct RewritingProxy {
    /// Where it listens on 127.0.0.1.
    pub port: u16,
    /// The store it stands in front of, reached through it: the same URL with
    /// the proxy's host and port (the path is kept: Azurite's names the account).
    pub endpoint: Endpoint,
    task: tokio::task::JoinHandle<()>,
}

impl RewritingProxy {
    /// Listens on a free local port, forwarding to the store at `store`.
    pub async fn start(store: &Endpoint, rewrite: Rewrite) -> Result<RewritingProxy> {
        RewritingProxy::start_answering(store, rewrite, Arc::new(|_| None)).await
    }

    /// Like [`RewritingProxy::start`], answering itself the requests
    /// `answer` picks (after `rewrite`).
    pub async fn start_answering(
        store: &Endpoint,
        rewrite: Rewrite,
        answer: Answer,
    ) -> Result<RewritingProxy> {
        let upstream = authority(&store.url)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let endpoint = Endpoint {
            url: store
                .url
                .replacen(&upstream, &format!("127.0.0.1:{port}"), 1),
        };
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, rewrite, answer) =
                    (upstream.clone(), rewrite.clone(), answer.clone());
                tokio::spawn(async move {
                    if let Err(err) = relay(client, &upstream, rewrite, answer).await {
                        eprintln!("rewriting proxy: {err:#}");
                    }
                });
            }
        });
        Ok(RewritingProxy {
            port,
            endpoint,
            task,
        })
    }
}

impl Drop for RewritingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The upstream of `url` (`http://host:port/…` → `host:port`).
fn authority(url: &str) -> Result<String> {
    let rest = url.strip_prefix("http://").context("an http:// URL")?;
    Ok(rest.split('/').next().unwrap_or(rest).to_string())
}

/// One client connection: requests rewritten one after another (these
/// clients never pipeline), answers copied back as they come. An answer the
/// proxy gives itself goes out between the server's: the client sent its
/// request only after reading the whole previous answer.
async fn relay(client: TcpStream, upstream: &str, rewrite: Rewrite, answer: Answer) -> Result<()> {
    let server = TcpStream::connect(upstream)
        .await
        .with_context(|| format!("connecting to {upstream}"))?;
    let (mut from_client, to_client) = client.into_split();
    let to_client = Arc::new(tokio::sync::Mutex::new(to_client));
    let (mut from_server, mut to_server) = server.into_split();
    let copier = to_client.clone();
    let answers = tokio::spawn(async move {
        let mut chunk = vec![0; 16 * 1024];
        while let Ok(n) = from_server.read(&mut chunk).await {
            if n == 0 || copier.lock().await.write_all(&chunk[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buffer = Vec::new();
    let outcome = async {
        loop {
            let Some((mut head, mut body)) = read_head(&mut from_client, &mut buffer).await? else {
                return Ok(());
            };
            if head
                .header("transfer-encoding")
                .is_some_and(|v| v.contains("chunked"))
            {
                bail!("a chunked request body: not handled by this proxy");
            }
            let length: usize = match head.header("content-length") {
                Some(value) => value.trim().parse().context("Content-Length")?,
                None => 0,
            };
            while body.len() < length {
                let mut chunk = vec![0; length - body.len()];
                let n = from_client.read(&mut chunk).await?;
                if n == 0 {
                    bail!("the client closed mid-body");
                }
                body.extend_from_slice(&chunk[..n]);
            }
            buffer = body.split_off(length);
            rewrite(&mut head);
            if let Some(canned) = answer(&head) {
                to_client.lock().await.write_all(&canned.encode()).await?;
                continue;
            }
            to_server.write_all(&head.encode()).await?;
            to_server.write_all(&body).await?;
        }
    }
    .await;
    answers.abort();
    outcome
}

/// Reads up to the end of a request head; `None` when the client closed
/// between requests. Returns the head and the bytes read past it.
async fn read_head(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    buffer: &mut Vec<u8>,
) -> Result<Option<(RequestHead, Vec<u8>)>> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            let text = String::from_utf8(std::mem::take(buffer)).context("a non-UTF-8 head")?;
            let mut lines = text.trim_end().split("\r\n");
            let line = lines.next().unwrap_or_default();
            let mut parts = line.split(' ');
            let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
                bail!("a request line {line:?}");
            };
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
                .collect();
            let head = RequestHead {
                method: method.to_string(),
                target: target.to_string(),
                headers,
            };
            return Ok(Some((head, rest)));
        }
        let mut chunk = [0; 8192];
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            if buffer.is_empty() {
                return Ok(None);
            }
            bail!("the client closed mid-head");
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}
