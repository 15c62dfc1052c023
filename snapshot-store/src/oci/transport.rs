//! HTTP exchanges with a registry under the transfer limits ([`Limits`]):
//! every response body is read with a size cap while it streams (a
//! manifest's 4 MiB, a token's 1 MiB, a blob's declared size, the first
//! 64 KiB of an error), every request runs under an idle timeout and a
//! deadline that grows with the bytes it may move, and idempotent requests
//! are retried with backoff ([`Backoff`]). The client (`client`) sends all
//! its requests through here; nothing reads a body whole.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{select, Either};
use futures_util::{Stream, StreamExt};
use reqwest::{RequestBuilder, Response, StatusCode, Url};
use tokio::time::Instant;

/// Largest part of an error answer's body read, for the message: the rest
/// is never read.
pub const MAX_ERROR_BODY_BYTES: u64 = 64 << 10;
/// Largest answer of a token endpoint read (distribution `token.md`).
pub const MAX_TOKEN_BYTES: u64 = 1 << 20;
/// Most redirects one request follows; a redirect from HTTPS to plain
/// HTTP is refused.
pub const MAX_REDIRECTS: usize = 5;
/// Bytes per piece of a request body: a body is sent in pieces this small
/// so that a slow but moving upload never looks idle.
const SEND_PIECE: usize = 64 << 10;
/// First backoff before a retry; it doubles with each retry, up to
/// [`BACKOFF_CAP`], and each wait is drawn between half of it and all of it.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest backoff before a retry.
const BACKOFF_CAP: Duration = Duration::from_secs(8);
/// Longest deadline of any request (a year): keeps instants in range.
pub const MAX_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The transfer limits of a push or pull: how long a connection, a silence
/// and a request may last, and how often a failed idempotent request is
/// tried again. [`Limits::DEFAULT`] gives the defaults (`vmstore`'s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Longest a connection may take to open (DNS, TCP, TLS handshake).
    /// Default 30 s.
    pub connect_timeout: Duration,
    /// Longest a request may go with no byte moving either way: from its
    /// start (the connection opening included) to its answer, while its
    /// body is sent, while its answer's body is read. A registry that stops
    /// mid-way fails here. Default 30 s.
    pub idle_timeout: Duration,
    /// Longest a request that moves no bulk of bytes may take, all told
    /// (connection, redirects, answer and its body). Default 60 s.
    pub request_timeout: Duration,
    /// Slowest average rate accepted, in bytes per second: a request that
    /// may move up to N bytes (a blob's declared size, a manifest's or
    /// token's cap) has `request_timeout` plus N at this rate to complete,
    /// so that a registry dripping a byte a second fails however it is
    /// timed, and a large blob on a slow link still completes. Default
    /// 64 KiB/s.
    pub min_rate: u64,
    /// Further attempts of an idempotent request (a `GET` or `HEAD`, a
    /// manifest's `PUT`, a blob upload restarted from its start) after a
    /// transient failure: no connection, an idle timeout, a broken
    /// connection, HTTP 408, 429 or 5xx. Never after a size cap, a deadline,
    /// a digest mismatch or another answer. Default 3.
    pub retries: u32,
}

impl Limits {
    /// The defaults: 30 s to connect, 30 s idle, 60 s per request plus its
    /// bytes at 64 KiB/s, 3 retries.
    pub const DEFAULT: Limits = Limits {
        connect_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(60),
        min_rate: 64 << 10,
        retries: 3,
    };

    /// The deadline of a request that may move up to `bytes` bytes:
    /// `request_timeout + bytes / min_rate`, at most [`MAX_DEADLINE`].
    pub fn deadline(&self, bytes: u64) -> Duration {
        let bulk = Duration::from_secs_f64(
            (bytes as f64 / self.min_rate.max(1) as f64).min(MAX_DEADLINE.as_secs_f64()),
        );
        self.request_timeout.saturating_add(bulk).min(MAX_DEADLINE)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// A request that did not get through one of the transfer limits, or whose
/// connection failed. Each variant's documentation gives its message.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TransferProblem {
    /// No connection: refused, no route, the connection timeout, TLS.
    ///
    /// Message: `cannot connect to HOST: MSG`.
    Connect {
        /// `host[:port]`.
        host: String,
        /// Why.
        msg: String,
    },
    /// A response body longer than its cap, or a blob longer than its
    /// declared size.
    ///
    /// Message: `WHAT exceeds SIZE` (a cap), or `WHAT is longer than its
    /// declared N bytes`.
    TooLarge {
        /// What was read and from where, e.g. `manifest from
        /// 127.0.0.1:5000/sandboxes/py:v1`.
        what: String,
        /// The cap, in bytes.
        max: u64,
        /// The cap is the size the descriptor declared.
        declared: bool,
    },
    /// No byte moved for [`Limits::idle_timeout`].
    ///
    /// Message: `no byte from HOST for N s while DOING`.
    Idle {
        /// `host[:port]`.
        host: String,
        /// The idle timeout, in seconds.
        secs: f64,
        /// `waiting for the answer`, `sending WHAT` or `reading WHAT`.
        doing: String,
    },
    /// Not done by the request's deadline ([`Limits::deadline`]).
    ///
    /// Message: `not complete after N s (its deadline: the request
    /// timeout, T s, plus SIZE at RATE/s) while DOING`, or without the
    /// sum for a request that moves no bulk.
    Deadline {
        /// The deadline, in seconds.
        secs: f64,
        /// The bytes it was computed for.
        bytes: u64,
        /// The request timeout, in seconds.
        base_secs: f64,
        /// The minimum rate, bytes per second.
        min_rate: u64,
        /// As for [`TransferProblem::Idle`].
        doing: String,
    },
    /// Too many redirects, or one from HTTPS to plain HTTP.
    ///
    /// Message: `MSG`.
    Redirect {
        /// What the redirect policy refused.
        msg: String,
    },
    /// The connection broke or closed before the answer's end.
    ///
    /// Message: `the connection broke: MSG`.
    Broken {
        /// The transport's error.
        msg: String,
    },
}

/// `n` bytes as `4 MiB`, `64 KiB`, or `N bytes` when not a round number.
pub(crate) fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// Seconds, briefly: `30`, `0.5`.
fn secs(s: f64) -> String {
    format!("{}", (s * 1000.0).round() / 1000.0)
}

impl std::fmt::Display for TransferProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransferProblem::Connect { host, msg } => write!(f, "cannot connect to {host}: {msg}"),
            TransferProblem::TooLarge {
                what,
                max,
                declared: false,
            } => write!(f, "{what} exceeds {}", size(*max)),
            TransferProblem::TooLarge { what, max, .. } => {
                write!(f, "{what} is longer than its declared {max} bytes")
            }
            TransferProblem::Idle { host, secs: s, doing } => {
                write!(f, "no byte from {host} for {} s while {doing}", secs(*s))
            }
            TransferProblem::Deadline {
                secs: s,
                bytes,
                base_secs,
                min_rate,
                doing,
            } if *bytes == 0 => write!(
                f,
                "not complete after {} s (its deadline, the request timeout) while {doing}",
                secs(*s)
            ),
            TransferProblem::Deadline {
                secs: s,
                bytes,
                base_secs,
                min_rate,
                doing,
            } => write!(
                f,
                "not complete after {} s (its deadline: the request timeout, {} s, plus {} at {}/s) while {doing}",
                secs(*s),
                secs(*base_secs),
                size(*bytes),
                size(*min_rate)
            ),
            TransferProblem::Redirect { msg } => f.write_str(msg),
            TransferProblem::Broken { msg } => write!(f, "the connection broke: {msg}"),
        }
    }
}

/// Why one attempt of a request failed.
#[derive(Debug)]
pub(crate) enum Kind {
    /// An answer with an unexpected status; `body` is the start of its
    /// body, printable, `cut` if there was more.
    Status {
        status: StatusCode,
        body: String,
        cut: bool,
    },
    /// A transfer problem.
    Transfer(TransferProblem),
    /// Something no retry can mend (a certificate refused, an unusable
    /// answer, a local file that changed while being sent).
    Fatal(String),
}

/// One failed attempt of a request: the request (`METHOD URL`) and why.
#[derive(Debug)]
pub(crate) struct Failure {
    pub request: String,
    pub kind: Kind,
}

impl Failure {
    /// Whether another attempt may succeed (see [`Limits::retries`]).
    pub(crate) fn transient(&self) -> bool {
        match &self.kind {
            Kind::Status { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::REQUEST_TIMEOUT
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
            Kind::Transfer(p) => matches!(
                p,
                TransferProblem::Connect { .. }
                    | TransferProblem::Idle { .. }
                    | TransferProblem::Broken { .. }
            ),
            Kind::Fatal(_) => false,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Status { status, body, cut } => {
                write!(f, "{} answered HTTP {status}", self.request)?;
                if !body.is_empty() {
                    write!(f, ": {body}")?;
                }
                if *cut {
                    write!(
                        f,
                        " (error body cut: only its first {} read)",
                        size(MAX_ERROR_BODY_BYTES)
                    )?;
                }
                Ok(())
            }
            Kind::Transfer(p) => write!(f, "{}: {p}", self.request),
            Kind::Fatal(msg) => write!(f, "{}: {msg}", self.request),
        }
    }
}

/// `e` and its sources, `: `-separated (an HTTP client's "error sending
/// request" says why only in its sources: refused connection, TLS).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        cur = s.source();
    }
    msg
}

/// Whether `e` or one of its sources is a TLS error (a refused
/// certificate), which no retry mends.
fn is_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        let inner = x
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        if x.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
            return true;
        }
        cur = x.source();
    }
    false
}

/// A registry's text (an error body) made safe to print: control
/// characters (a terminal's escape sequences) become spaces, and at most
/// 300 characters are kept.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text
        .chars()
        .take(300)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(300).is_some() {
        out.push_str("...");
    }
    out.trim().to_string()
}

/// The HTTP client of one push or pull, with its limits.
pub(crate) struct Http {
    pub client: reqwest::Client,
    pub limits: Limits,
}

impl Http {
    /// A client: connections time out after `limits.connect_timeout`, at
    /// most [`MAX_REDIRECTS`] redirects and never from HTTPS to HTTP, no
    /// decompression of answers.
    pub(crate) fn new(limits: Limits) -> Result<Http, String> {
        let policy = reqwest::redirect::Policy::custom(|a| {
            let downgrade = a.previous().last().is_some_and(|p| p.scheme() == "https")
                && a.url().scheme() != "https";
            if a.previous().len() > MAX_REDIRECTS {
                let msg = format!(
                    "more than {MAX_REDIRECTS} redirects (the last to {})",
                    a.url()
                );
                a.error(msg)
            } else if downgrade {
                let msg = format!("a redirect from HTTPS to plain HTTP ({}) refused", a.url());
                a.error(msg)
            } else {
                a.follow()
            }
        });
        let client = reqwest::Client::builder()
            .connect_timeout(limits.connect_timeout)
            .redirect(policy)
            .user_agent(concat!("vmstore/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| chain(&e))?;
        Ok(Http { client, limits })
    }

    /// The clocks of one request to `url` that may move up to `bytes`
    /// bytes: `METHOD URL` (without its query) and `what` (`manifest from
    /// REF`) name it in failures.
    pub(crate) fn watch(&self, method: &str, url: &Url, what: &str, bytes: u64) -> Watch {
        let start = Instant::now();
        let l = &self.limits;
        let mut shown = url.clone();
        shown.set_query(None);
        Watch {
            request: format!("{method} {shown}"),
            host: host_of(url),
            what: what.to_string(),
            limits: *l,
            bytes,
            deadline: start + l.deadline(bytes),
            shared: Arc::new(Shared {
                start,
                last_ms: AtomicU64::new(0),
                phase: AtomicU8::new(Phase::Answer as u8),
                local_error: Mutex::new(None),
            }),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Answer = 0,
    Sending = 1,
    Reading = 2,
}

/// What a request's body stream and its watch share.
struct Shared {
    start: Instant,
    /// When a byte last moved, in milliseconds after `start`.
    last_ms: AtomicU64,
    phase: AtomicU8,
    /// An error of the local file being sent (not the network's).
    local_error: Mutex<Option<String>>,
}

impl Shared {
    fn touch(&self, phase: Phase) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Relaxed);
    }
}

/// `host[:port]` of `url`.
pub(crate) fn host_of(url: &Url) -> String {
    let h = url.host_str().unwrap_or("");
    url.port().map_or(h.to_string(), |p| format!("{h}:{p}"))
}

/// The clocks of one request: its deadline and when a byte last moved.
pub(crate) struct Watch {
    request: String,
    host: String,
    what: String,
    limits: Limits,
    bytes: u64,
    deadline: Instant,
    shared: Arc<Shared>,
}

impl Watch {
    /// A failure of this request.
    pub(crate) fn fail(&self, kind: Kind) -> Failure {
        Failure {
            request: self.request.clone(),
            kind,
        }
    }

    fn doing(&self) -> String {
        match self.shared.phase.load(Ordering::Relaxed) {
            p if p == Phase::Sending as u8 => format!("sending {}", self.what),
            p if p == Phase::Reading as u8 => format!("reading {}", self.what),
            _ => "waiting for the answer".to_string(),
        }
    }

    /// Fires when the deadline passes or nothing has moved for the idle
    /// timeout.
    async fn alarm(&self) -> Failure {
        loop {
            let last =
                |s: &Shared| s.start + Duration::from_millis(s.last_ms.load(Ordering::Relaxed));
            let idle_at = |s: &Shared| last(s).checked_add(self.limits.idle_timeout);
            let at = idle_at(&self.shared).map_or(self.deadline, |t| t.min(self.deadline));
            tokio::time::sleep_until(at).await;
            let now = Instant::now();
            let l = &self.limits;
            if now >= self.deadline {
                return self.fail(Kind::Transfer(TransferProblem::Deadline {
                    secs: l.deadline(self.bytes).as_secs_f64(),
                    bytes: self.bytes,
                    base_secs: l.request_timeout.as_secs_f64(),
                    min_rate: l.min_rate,
                    doing: self.doing(),
                }));
            }
            if idle_at(&self.shared).is_some_and(|t| now >= t) {
                return self.fail(Kind::Transfer(TransferProblem::Idle {
                    host: self.host.clone(),
                    secs: l.idle_timeout.as_secs_f64(),
                    doing: self.doing(),
                }));
            }
        }
    }

    /// `fut`, unless the deadline or the idle timeout comes first.
    pub(crate) async fn run<T>(
        &self,
        fut: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let fut = std::pin::pin!(fut);
        let alarm = std::pin::pin!(self.alarm());
        match select(fut, alarm).await {
            Either::Left((r, _)) => r,
            Either::Right((f, _)) => Err(f),
        }
    }

    /// `e`, from sending or reading, as a failure.
    fn transport(&self, e: reqwest::Error) -> Failure {
        if let Some(local) = self
            .shared
            .local_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return self.fail(Kind::Fatal(local));
        }
        let tls = is_tls(&e);
        let (connect, redirect, timeout) = (e.is_connect(), e.is_redirect(), e.is_timeout());
        if redirect {
            // The redirect policy's own message is the innermost source.
            let mut inner: &dyn std::error::Error = &e;
            while let Some(s) = inner.source() {
                inner = s;
            }
            let msg = inner.to_string();
            return self.fail(Kind::Transfer(TransferProblem::Redirect { msg }));
        }
        let msg = chain(&e.without_url());
        if tls {
            return self.fail(Kind::Fatal(msg));
        }
        if connect {
            let msg = if timeout {
                format!(
                    "no connection within {} s",
                    secs(self.limits.connect_timeout.as_secs_f64())
                )
            } else {
                msg
            };
            return self.fail(Kind::Transfer(TransferProblem::Connect {
                host: self.host.clone(),
                msg,
            }));
        }
        self.fail(Kind::Transfer(TransferProblem::Broken { msg }))
    }

    /// Send the request and wait for its answer's head.
    pub(crate) async fn send(&self, rb: RequestBuilder) -> Result<Response, Failure> {
        let r = self
            .run(async { rb.send().await.map_err(|e| self.transport(e)) })
            .await?;
        self.shared.touch(Phase::Reading);
        Ok(r)
    }

    /// The next piece of `resp`'s body, `None` at its end.
    pub(crate) async fn chunk(&self, resp: &mut Response) -> Result<Option<Bytes>, Failure> {
        let c = self
            .run(async { resp.chunk().await.map_err(|e| self.transport(e)) })
            .await?;
        self.shared.touch(Phase::Reading);
        Ok(c)
    }

    /// The whole body of `resp`, which may be at most `max` bytes
    /// ([`TransferProblem::TooLarge`] as soon as it is known to be longer:
    /// from its `Content-Length`, or while it streams).
    pub(crate) async fn read_capped(
        &self,
        resp: &mut Response,
        max: u64,
    ) -> Result<Vec<u8>, Failure> {
        let too_large = || {
            self.fail(Kind::Transfer(TransferProblem::TooLarge {
                what: self.what.clone(),
                max,
                declared: false,
            }))
        };
        if resp.content_length().is_some_and(|n| n > max) {
            return Err(too_large());
        }
        let mut out = Vec::new();
        while let Some(c) = self.chunk(resp).await? {
            if (out.len() + c.len()) as u64 > max {
                return Err(too_large());
            }
            out.extend_from_slice(&c);
        }
        Ok(out)
    }

    /// The failure an answer with an unexpected status stands for, with the
    /// start of its body: at most [`MAX_ERROR_BODY_BYTES`], read for at most
    /// the idle timeout (and within the request's clocks); the rest is
    /// never read.
    pub(crate) async fn status(&self, mut resp: Response) -> Failure {
        let status = resp.status();
        let mut body = Vec::new();
        let mut cut = resp
            .content_length()
            .is_some_and(|n| n > MAX_ERROR_BODY_BYTES);
        let read = async {
            while (body.len() as u64) < MAX_ERROR_BODY_BYTES {
                match self.chunk(&mut resp).await {
                    Ok(Some(c)) => {
                        let room = MAX_ERROR_BODY_BYTES as usize - body.len();
                        body.extend_from_slice(&c[..c.len().min(room)]);
                    }
                    Ok(None) => return true,
                    Err(_) => return false,
                }
            }
            false
        };
        let complete = tokio::time::timeout(self.limits.idle_timeout, read)
            .await
            .unwrap_or(false);
        cut |= !complete;
        self.fail(Kind::Status {
            status,
            body: error_text(&body),
            cut,
        })
    }

    /// `stream`, `size` bytes, as a request body, sent in pieces of at most
    /// [`SEND_PIECE`] bytes, each accepted piece counting as progress; once
    /// the last is handed over, the answer is awaited. An error of the
    /// stream (the local file's) fails the request without a retry.
    pub(crate) fn body<S>(&self, stream: S, size: u64) -> reqwest::Body
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    {
        let shared = self.shared.clone();
        let pieces = futures_util::stream::unfold(
            (Box::pin(stream), Bytes::new(), shared, size),
            |(mut inner, mut rest, shared, mut left)| async move {
                if rest.is_empty() {
                    match inner.next().await {
                        None => {
                            // All sent: the answer is awaited now.
                            shared.touch(Phase::Answer);
                            return None;
                        }
                        Some(Err(e)) => {
                            let msg = e.to_string();
                            *shared.local_error.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(msg);
                            return Some((Err(e), (inner, rest, shared, left)));
                        }
                        Some(Ok(b)) => rest = b,
                    }
                }
                let piece = rest.split_to(rest.len().min(SEND_PIECE));
                left = left.saturating_sub(piece.len() as u64);
                shared.touch(if left == 0 {
                    Phase::Answer
                } else {
                    Phase::Sending
                });
                Some((Ok(piece), (inner, rest, shared, left)))
            },
        );
        reqwest::Body::wrap_stream(pieces)
    }
}

/// The text of an error body: a distribution-spec error envelope as
/// `CODE: message` items, else the body's start, printable.
fn error_text(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Item {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Item>,
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(e) if !e.errors.is_empty() => printable(
            e.errors
                .iter()
                .map(|i| format!("{}: {}", i.code, i.message))
                .collect::<Vec<_>>()
                .join("; ")
                .as_bytes(),
        ),
        _ => printable(body),
    }
}

/// The retries of one request ([`Limits::retries`]), with exponential
/// backoff and jitter.
pub(crate) struct Backoff {
    retries: u32,
    attempts: u32,
}

impl Backoff {
    pub(crate) fn new(limits: &Limits) -> Backoff {
        Backoff {
            retries: limits.retries,
            attempts: 0,
        }
    }

    /// Attempts made so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// After a failed attempt: `true` once the backoff has passed if `f`
    /// may be retried and retries are left, else `false` at once.
    pub(crate) async fn retry(&mut self, f: &Failure) -> bool {
        self.attempts += 1;
        if !f.transient() || self.attempts > self.retries {
            return false;
        }
        let full = BACKOFF_BASE
            .saturating_mul(1 << (self.attempts - 1).min(16))
            .min(BACKOFF_CAP);
        // Between half the backoff and all of it.
        let jitter = (crate::fsutil::nonce() % 1024) as f64 / 1024.0;
        let wait = full.mul_f64(0.5 + 0.5 * jitter);
        tracing::warn!(
            "{f}; retrying in {:.1} s (retry {} of {})",
            wait.as_secs_f64(),
            self.attempts,
            self.retries
        );
        tokio::time::sleep(wait).await;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_grow_with_the_bytes_moved() {
        let l = Limits::DEFAULT;
        assert_eq!(l.deadline(0), Duration::from_secs(60));
        assert_eq!(l.deadline(4 << 20), Duration::from_secs(60 + 64));
        assert_eq!(l.deadline(u64::MAX), MAX_DEADLINE);
        let fast = Limits {
            min_rate: u64::MAX,
            ..l
        };
        assert!(fast.deadline(1 << 40) < Duration::from_secs(61));
    }

    #[test]
    fn messages_name_the_limit() {
        let p = TransferProblem::TooLarge {
            what: "manifest from r/x:v1".into(),
            max: 4 << 20,
            declared: false,
        };
        assert_eq!(p.to_string(), "manifest from r/x:v1 exceeds 4 MiB");
        let p = TransferProblem::Idle {
            host: "r:5000".into(),
            secs: 30.0,
            doing: "reading blob sha256:00".into(),
        };
        assert_eq!(
            p.to_string(),
            "no byte from r:5000 for 30 s while reading blob sha256:00"
        );
        assert_eq!(size(1000), "1000 bytes");
        assert_eq!(size(64 << 10), "64 KiB");
    }

    #[test]
    fn error_bodies_are_printable() {
        assert_eq!(
            error_text(br#"{"errors":[{"code":"DENIED","message":"no"}]}"#),
            "DENIED: no"
        );
        assert_eq!(error_text(b"\x1b[31mred\x1b[0m\n"), "[31mred [0m");
        let long = vec![b'a'; 1000];
        assert_eq!(error_text(&long).len(), 303);
    }

    #[test]
    fn what_is_retried() {
        let f = |kind| Failure {
            request: "GET u".into(),
            kind,
        };
        let status = |s: u16| Kind::Status {
            status: StatusCode::from_u16(s).unwrap(),
            body: String::new(),
            cut: false,
        };
        assert!(f(status(503)).transient() && f(status(429)).transient());
        assert!(!f(status(404)).transient() && !f(status(401)).transient());
        let broken = TransferProblem::Broken {
            msg: "reset".into(),
        };
        assert!(f(Kind::Transfer(broken)).transient());
        let big = TransferProblem::TooLarge {
            what: "m".into(),
            max: 1,
            declared: false,
        };
        assert!(!f(Kind::Transfer(big)).transient());
        assert!(!f(Kind::Fatal("certificate".into())).transient());
    }
}
