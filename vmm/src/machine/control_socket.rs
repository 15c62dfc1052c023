//! The control socket, `boot --control PATH`: a Unix stream socket (mode
//! 0600) where programs drive the VM with newline-delimited JSON, one
//! request and one response per line. Requests:
//!
//! ```text
//! {"command": "snapshot", "name": "NAME"}   name optional: the next of --name's NAME, NAME.2, ...
//! {"command": "pause"}
//! {"command": "resume"}
//! {"command": "status"}
//! {"command": "quit"}
//! {"command": "branch", "name": "NAME", "count": N, "net": "tap:vm{i}", "start": "fork"}   name, net, start optional
//! {"command": "exec", "argv": ["sh", "-c", "..."], "stdin": "BASE64", "timeout_ms": 60000}
//! ```
//!
//! `exec` runs a command through the guest agent (`stdin` and
//! `timeout_ms` optional: `/dev/null`, [`DEFAULT_EXEC_TIMEOUT_MS`]) and
//! answers with its exit and its output in base64.
//!
//! Responses are `{"ok": true, "result": {...}}` or `{"ok": false, "error":
//! {"code": CODE, "message": "..."}}` with CODE one of [`ErrorCode`]'s. A
//! request line is at most [`MAX_REQUEST_BYTES`]; a longer, malformed or
//! unknown request (a key given twice included) gets an error and changes
//! nothing. At most [`MAX_CLIENTS`] clients may be connected at once, each
//! served on its own thread: one client's long request (a snapshot) holds
//! back only requests that must wait for it, never another client's
//! `status`. A further client gets a `too_many_clients` error line and is
//! closed. A client may stay connected and idle for as long as it likes,
//! but one that has sent part of a line must finish it within
//! [`PARTIAL_LINE_TIMEOUT`], and read its responses within
//! [`WRITE_TIMEOUT`], or it is closed. A client that goes away mid-request
//! changes nothing but what the request did. The protocol is documented,
//! with a schema, in the book's control-socket chapter.
//!
//! This is a front-end: each request is a verb ([`crate::machine::ops`]).

use crate::machine::ops::{
    BranchError, BranchStart, ExecError, ExecOp, Op, OpError, SnapshotWait, Verbs,
    MAX_EXEC_TIMEOUT_MS,
};
use crate::sync::{Locked, Waited};
use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest request line, in bytes (newline included).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Most clients connected at once; a further one is refused
/// ([`ErrorCode::TooManyClients`]). Far more than a supervisor needs (one
/// connection for its requests, one more for `status` while a snapshot is
/// under way), few enough that the threads serving them stay cheap.
pub const MAX_CLIENTS: usize = 64;

/// How long a client may take to finish a line it has begun; then it gets
/// [`ErrorCode::Timeout`] and is closed. An idle client (no partial line)
/// is never timed out.
pub const PARTIAL_LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// An `exec` request's timeout without `timeout_ms`: a minute.
pub const DEFAULT_EXEC_TIMEOUT_MS: u32 = 60_000;

/// How long writing a response may wait for a client that does not read;
/// then the client is closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Error codes of the control socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, not a request object, a key given twice, or a field the
    /// command does not take.
    BadRequest,
    /// Longer than [`MAX_REQUEST_BYTES`].
    TooLarge,
    /// A `command` this VMM does not have.
    UnknownCommand,
    /// The request is valid, but the VM cannot do it now (e.g. `resume`
    /// while running).
    Refused,
    /// The snapshot failed; nothing was written.
    SnapshotFailed,
    /// `branch`: the layer's or a child's name is taken, or the branch
    /// directory exists.
    Exists,
    /// `branch`: a count of 0 or above the limit.
    BadCount,
    /// `branch`: the source was not started with `--track-dirty`.
    NeedsTrackDirty,
    /// `branch`: the layer was written, but a child failed to start or to
    /// become ready; every child of the request was stopped.
    BranchFailed,
    /// The guest agent did not run the `exec` (nothing listens, no such
    /// command, ...) or its output exceeded the bound.
    ExecFailed,
    /// [`MAX_CLIENTS`] clients are connected: this one is closed.
    TooManyClients,
    /// A line begun was not finished within [`PARTIAL_LINE_TIMEOUT`]: the
    /// client is closed.
    Timeout,
}

impl ErrorCode {
    /// The code of a verb's error.
    fn of(e: &OpError) -> Self {
        match e {
            OpError::Pause(_) => ErrorCode::Refused,
            OpError::Snapshot(_) | OpError::Branch(BranchError::Snapshot(_)) => {
                ErrorCode::SnapshotFailed
            }
            OpError::Exec(ExecError::NoAgent) => ErrorCode::Refused,
            OpError::Exec(ExecError::Agent(_)) => ErrorCode::ExecFailed,
            OpError::Branch(e) => match e {
                BranchError::Exists(_) => ErrorCode::Exists,
                BranchError::Count { .. } => ErrorCode::BadCount,
                BranchError::NoTrackDirty => ErrorCode::NeedsTrackDirty,
                BranchError::BadName(_) => ErrorCode::BadRequest,
                BranchError::Child { .. } | BranchError::Failed(_) => ErrorCode::BranchFailed,
                BranchError::Network(_)
                | BranchError::NoFork(_)
                | BranchError::NoDir
                | BranchError::PathTooLong(_)
                | BranchError::Snapshot(_) => ErrorCode::Refused,
            },
        }
    }
}

/// Why a request line is refused: its code and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// [`ErrorCode::BadRequest`] or [`ErrorCode::UnknownCommand`].
    pub code: ErrorCode,
    /// What is wrong, for the client.
    pub message: String,
}

/// A request line's fields, deserialized straight from its bytes, as the
/// store deserializes a manifest: serde's derive refuses a key given twice
/// (which a detour through `serde_json::Value` would let the last one win)
/// and, with `deny_unknown_fields`, a key no command takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    command: String,
    /// `Some` when the key is there (its value may be `null`).
    #[serde(default, deserialize_with = "present")]
    name: Option<Option<String>>,
    /// `branch`'s count.
    #[serde(default)]
    count: Option<u64>,
    /// `branch`'s network template.
    #[serde(default)]
    net: Option<String>,
    /// `branch`'s start.
    #[serde(default)]
    start: Option<BranchStart>,
    /// `exec`'s, `Some` when the key is there (as `name`).
    #[serde(default, deserialize_with = "present")]
    argv: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    stdin: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    timeout_ms: Option<Option<u32>>,
}

/// A key that is there: `Some` of its value.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The commands, for the unknown command's message.
const COMMANDS: [&str; 7] = [
    "snapshot", "pause", "resume", "status", "quit", "branch", "exec",
];

/// Parses one request line (untrusted) into its verb: a snapshot answered
/// once its layer is committed, or another verb. Errors:
/// [`ErrorCode::BadRequest`] (not JSON, not an object with a string
/// `command`, a key given twice, a field the command does not take) and
/// [`ErrorCode::UnknownCommand`].
pub fn parse_request(line: &[u8]) -> Result<Op, RequestError> {
    let bad = |message: String| RequestError {
        code: ErrorCode::BadRequest,
        message,
    };
    // An object, not an array serde would take as the struct's fields.
    if line.trim_ascii_start().first() != Some(&b'{') {
        return Err(bad(
            "a request is an object with a string \"command\"".into()
        ));
    }
    let f: Fields = serde_json::from_slice(line).map_err(|e| bad(format!("bad request: {e}")))?;
    let branch_fields = [
        ("count", f.count.is_some()),
        ("net", f.net.is_some()),
        ("start", f.start.is_some()),
    ];
    for (field, there) in branch_fields {
        if there && f.command != "branch" {
            return Err(bad(format!(
                "unknown field '{field}' in a '{}' request",
                f.command
            )));
        }
    }
    let exec_fields = [
        ("argv", f.argv.is_some()),
        ("stdin", f.stdin.is_some()),
        ("timeout_ms", f.timeout_ms.is_some()),
    ];
    if let Some((field, _)) = exec_fields.iter().find(|(_, there)| *there) {
        if f.command != "exec" && COMMANDS.contains(&f.command.as_str()) {
            return Err(bad(format!(
                "unknown field '{field}' in a '{}' request",
                f.command
            )));
        }
    }
    let op = match f.command.as_str() {
        "branch" => {
            let count = f
                .count
                .ok_or_else(|| bad("a 'branch' request needs a \"count\"".into()))?;
            return Ok(Op::Branch {
                name: f.name.flatten(),
                count: usize::try_from(count).unwrap_or(usize::MAX),
                net: f.net,
                start: f.start,
            });
        }
        "snapshot" => {
            return Ok(Op::Snapshot {
                name: f.name.flatten(),
                wait: SnapshotWait::Committed,
            })
        }
        "pause" => Op::Pause,
        "resume" => Op::Resume,
        "status" => Op::Status,
        "quit" => Op::Quit,
        "exec" if f.name.is_none() => return exec_request(f).map_err(bad),
        "exec" => return Err(bad("unknown field 'name' in a 'exec' request".into())),
        c => {
            return Err(RequestError {
                code: ErrorCode::UnknownCommand,
                message: format!("unknown command '{c}' (commands: {})", COMMANDS.join(", ")),
            })
        }
    };
    if f.name.is_some() {
        return Err(bad(format!(
            "unknown field 'name' in a '{}' request",
            f.command
        )));
    }
    Ok(op)
}

/// An `exec` request's verb, or what is wrong with it.
fn exec_request(f: Fields) -> Result<Op, String> {
    let argv = f.argv.flatten().ok_or("an 'exec' request needs \"argv\"")?;
    if argv.is_empty() || argv.len() > agent_client::frame::MAX_ARGS {
        return Err(format!(
            "\"argv\" has {} strings (1 to {})",
            argv.len(),
            agent_client::frame::MAX_ARGS
        ));
    }
    let stdin = f
        .stdin
        .flatten()
        .map(|s| base64::engine::general_purpose::STANDARD.decode(s))
        .transpose()
        .map_err(|e| format!("\"stdin\" is not base64: {e}"))?;
    let timeout_ms = f.timeout_ms.flatten().unwrap_or(DEFAULT_EXEC_TIMEOUT_MS);
    if !(1..=MAX_EXEC_TIMEOUT_MS).contains(&timeout_ms) {
        return Err(format!(
            "\"timeout_ms\" is {timeout_ms} (1 to {MAX_EXEC_TIMEOUT_MS})"
        ));
    }
    Ok(Op::Exec(ExecOp {
        argv,
        stdin,
        timeout_ms,
    }))
}

/// The connected clients and the requests being answered, counted so that
/// a further client is refused and the VM's end waits for the answers.
#[derive(Default)]
struct Clients {
    count: Mutex<Counts>,
    done: Condvar,
}

#[derive(Default)]
struct Counts {
    connected: usize,
    in_flight: usize,
}

/// A connected client's place, given back when dropped.
struct Seat(Arc<Clients>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.count.locked().connected -= 1;
    }
}

/// The socket file (removed when dropped) and its clients.
pub struct Socket {
    path: PathBuf,
    clients: Arc<Clients>,
}

impl Socket {
    /// Waits until every request being answered has its answer written
    /// (the VM has ended: verbs still arriving are refused at once).
    pub fn drain(&self) {
        let mut n = self.clients.count.locked();
        while n.in_flight > 0 {
            n = self.clients.done.waited(n);
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` (mode 0600; a stale socket there replaced, a live one
/// or any other file refused: [`crate::host_socket::listen`]) and serves
/// `verbs` on a thread per client, at most [`MAX_CLIENTS`] at once.
pub fn listen(path: &Path, verbs: Arc<dyn Verbs>) -> anyhow::Result<Socket> {
    let listener = crate::host_socket::listen(path)
        .map_err(|e| anyhow::anyhow!("--control {}: {e}", path.display()))?;
    let clients = Arc::new(Clients::default());
    let all = clients.clone();
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let Some(seat) = seat(&all) else {
                    refuse(stream);
                    continue;
                };
                let (verbs, all) = (verbs.clone(), all.clone());
                let _ = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || serve(&*verbs, &all, seat, stream));
            }
        })?;
    Ok(Socket {
        path: path.to_path_buf(),
        clients,
    })
}

/// A seat for a new client, if fewer than [`MAX_CLIENTS`] are connected.
fn seat(clients: &Arc<Clients>) -> Option<Seat> {
    let mut n = clients.count.locked();
    if n.connected >= MAX_CLIENTS {
        return None;
    }
    n.connected += 1;
    Some(Seat(clients.clone()))
}

/// Tells a client there is no room for it, without waiting for it, and
/// closes it.
fn refuse(mut stream: UnixStream) {
    let line = error(
        ErrorCode::TooManyClients,
        format!("{MAX_CLIENTS} control clients are connected; try again once one has closed"),
    );
    // A new socket's send buffer is empty: the line fits without waiting.
    let _ = stream.set_nonblocking(true);
    let _ = writeln!(stream, "{line}");
}

/// Serves one client until it disconnects (or is closed for a timeout).
fn serve(verbs: &dyn Verbs, clients: &Clients, _seat: Seat, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    // The read timeout wakes the reader to check a partial line's age.
    if stream.set_read_timeout(Some(PARTIAL_LINE_TIMEOUT)).is_err()
        || out.set_write_timeout(Some(WRITE_TIMEOUT)).is_err()
    {
        return;
    }
    let mut input = BufReader::new(stream);
    loop {
        let (answer, last) = match read_line(&mut input, PARTIAL_LINE_TIMEOUT) {
            Line::Eof => return,
            Line::TooLarge => (
                error(
                    ErrorCode::TooLarge,
                    format!("request longer than {MAX_REQUEST_BYTES} bytes"),
                ),
                false,
            ),
            Line::TimedOut => (
                error(
                    ErrorCode::Timeout,
                    format!(
                        "no end of line within {} s of its start; closing",
                        PARTIAL_LINE_TIMEOUT.as_secs()
                    ),
                ),
                true,
            ),
            Line::Request(bytes) => {
                clients.count.locked().in_flight += 1;
                let answer = handle(verbs, &bytes);
                let written = writeln!(out, "{answer}");
                clients.count.locked().in_flight -= 1;
                clients.done.notify_all();
                if written.is_err() {
                    return;
                }
                continue;
            }
        };
        if writeln!(out, "{answer}").is_err() || last {
            return;
        }
    }
}

/// A line read from a client.
enum Line {
    Request(Vec<u8>),
    TooLarge,
    /// A line begun and not finished in time.
    TimedOut,
    Eof,
}

/// Reads one line of at most [`MAX_REQUEST_BYTES`]; a longer one is read to
/// its end and dropped. `input`'s reads time out now and then (the
/// stream's read timeout): a line begun more than `limit` ago is
/// [`Line::TimedOut`]; with nothing begun, the wait goes on.
fn read_line(input: &mut impl BufRead, limit: Duration) -> Line {
    let mut line = Vec::new();
    let mut too_large = false;
    let mut begun: Option<Instant> = None;
    loop {
        let buf = match input.fill_buf() {
            Ok([]) => return Line::Eof,
            Ok(b) => b,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if begun.is_some_and(|t| t.elapsed() >= limit) {
                    return Line::TimedOut;
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Line::Eof,
        };
        begun.get_or_insert_with(Instant::now);
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        if !too_large {
            if line.len() + chunk.len() > MAX_REQUEST_BYTES {
                too_large = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let n = chunk.len();
        input.consume(n);
        if done {
            return if too_large {
                Line::TooLarge
            } else {
                Line::Request(line)
            };
        }
        // A line trickling in, a byte now and then, times out too.
        if begun.is_some_and(|t| t.elapsed() >= limit) {
            return Line::TimedOut;
        }
    }
}

/// Answers one request line.
fn handle(verbs: &dyn Verbs, bytes: &[u8]) -> String {
    let op = match parse_request(bytes) {
        Ok(op) => op,
        Err(e) => return error(e.code, e.message),
    };
    match verbs.execute(op) {
        Ok(reply) => serde_json::json!({"ok": true, "result": reply}).to_string(),
        Err(e) => error(ErrorCode::of(&e), e.to_string()),
    }
}

fn error(code: ErrorCode, message: String) -> String {
    serde_json::json!({"ok": false, "error": {"code": code, "message": message}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(bytes: &[u8]) -> Option<ErrorCode> {
        parse_request(bytes).err().map(|e| e.code)
    }

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_request(br#"{"command":"snapshot","name":"a"}"#),
            Ok(Op::Snapshot {
                name: Some("a".into()),
                wait: SnapshotWait::Committed
            })
        );
        assert_eq!(
            parse_request(br#" {"command":"snapshot"}"#),
            Ok(Op::Snapshot {
                name: None,
                wait: SnapshotWait::Committed
            })
        );
        assert_eq!(parse_request(b"{\"command\":\"status\"}\n"), Ok(Op::Status));
        assert_eq!(parse_request(br#"{"command":"quit"}"#), Ok(Op::Quit));
        assert_eq!(code(b"{"), Some(ErrorCode::BadRequest));
        assert_eq!(code(b""), Some(ErrorCode::BadRequest));
        assert_eq!(code(b"[1]"), Some(ErrorCode::BadRequest));
        assert_eq!(code(br#"["status"]"#), Some(ErrorCode::BadRequest));
        assert_eq!(code(br#"{"command":7}"#), Some(ErrorCode::BadRequest));
        assert_eq!(code(br#"{}"#), Some(ErrorCode::BadRequest));
        assert_eq!(
            code(br#"{"command":"reboot"}"#),
            Some(ErrorCode::UnknownCommand)
        );
        assert_eq!(
            code(br#"{"command":"pause","x":1}"#),
            Some(ErrorCode::BadRequest)
        );
        assert_eq!(
            code(br#"{"command":"pause","name":null}"#),
            Some(ErrorCode::BadRequest)
        );
        assert_eq!(
            code(br#"{"command":"snapshot","name":3}"#),
            Some(ErrorCode::BadRequest)
        );
    }

    #[test]
    fn branch_requests_parse() {
        assert_eq!(
            parse_request(br#"{"command":"branch","name":"b","count":4}"#),
            Ok(Op::Branch {
                name: Some("b".into()),
                count: 4,
                net: None,
                start: None,
            })
        );
        assert_eq!(
            parse_request(br#"{"command":"branch","count":2,"net":"tap:vm{i}","start":"exec"}"#),
            Ok(Op::Branch {
                name: None,
                count: 2,
                net: Some("tap:vm{i}".into()),
                start: Some(BranchStart::Exec),
            })
        );
        assert_eq!(
            parse_request(br#"{"command":"branch","count":0}"#),
            Ok(Op::Branch {
                name: None,
                count: 0,
                net: None,
                start: None,
            })
        );
        for bad in [
            &br#"{"command":"branch"}"#[..],
            br#"{"command":"branch","count":-1}"#,
            br#"{"command":"branch","count":1.5}"#,
            br#"{"command":"branch","count":"2"}"#,
            br#"{"command":"snapshot","count":2}"#,
            br#"{"command":"snapshot","net":"passt"}"#,
            br#"{"command":"branch","count":2,"net":3}"#,
            br#"{"command":"branch","count":2,"count":3}"#,
            br#"{"command":"branch","count":2,"start":"clone"}"#,
            br#"{"command":"snapshot","start":"fork"}"#,
        ] {
            assert_eq!(code(bad), Some(ErrorCode::BadRequest), "{bad:?}");
        }
    }

    #[test]
    fn exec_requests_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_request(br#"{"command":"exec","argv":["sh","-c","exit 3"]}"#),
            Ok(Op::Exec(ExecOp {
                argv: vec!["sh".into(), "-c".into(), "exit 3".into()],
                stdin: None,
                timeout_ms: DEFAULT_EXEC_TIMEOUT_MS,
            }))
        );
        assert_eq!(
            parse_request(
                br#"{"command":"exec","argv":["cat"],"stdin":"AAEC/w==","timeout_ms":5}"#
            ),
            Ok(Op::Exec(ExecOp {
                argv: vec!["cat".into()],
                stdin: Some(vec![0, 1, 2, 255]),
                timeout_ms: 5,
            }))
        );
        for (bad, says) in [
            (&br#"{"command":"exec"}"#[..], "needs \"argv\""),
            (br#"{"command":"exec","argv":[]}"#, "0 strings"),
            (br#"{"command":"exec","argv":"ls"}"#, "bad request"),
            (
                br#"{"command":"exec","argv":["ls"],"stdin":"%%"}"#,
                "not base64",
            ),
            (
                br#"{"command":"exec","argv":["ls"],"timeout_ms":0}"#,
                "is 0",
            ),
            (
                br#"{"command":"exec","argv":["ls"],"timeout_ms":3600001}"#,
                "is 3600001",
            ),
            (
                br#"{"command":"exec","argv":["ls"],"timeout_ms":-1}"#,
                "bad request",
            ),
            (br#"{"command":"exec","argv":["ls"],"name":"x"}"#, "'name'"),
            (br#"{"command":"status","argv":["ls"]}"#, "'argv'"),
            (br#"{"command":"quit","stdin":null}"#, "'stdin'"),
            (br#"{"command":"snapshot","timeout_ms":1}"#, "'timeout_ms'"),
        ] {
            let e = parse_request(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest, "{}", e.message);
            assert!(
                e.message.contains(says),
                "{}: {}",
                String::from_utf8_lossy(bad),
                e.message
            );
        }
        let many = format!(
            r#"{{"command":"exec","argv":[{}]}}"#,
            vec!["\"x\""; agent_client::frame::MAX_ARGS + 1].join(",")
        );
        assert!(parse_request(many.as_bytes())
            .unwrap_err()
            .message
            .contains("4097 strings"));
    }

    #[test]
    fn a_key_given_twice_is_a_bad_request() {
        // The last one must not win: this is not a quit.
        let e = parse_request(br#"{"command":"status","command":"quit"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(
            e.message.contains("duplicate field `command`"),
            "{}",
            e.message
        );
        let e = parse_request(br#"{"command":"snapshot","name":"a","name":"b"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(
            e.message.contains("duplicate field `name`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn lines_are_bounded() {
        let mut big = vec![b'x'; MAX_REQUEST_BYTES + 10];
        big.push(b'\n');
        big.extend_from_slice(b"{\"command\":\"status\"}\n");
        let mut r = BufReader::with_capacity(1000, &big[..]);
        let limit = Duration::from_secs(3600);
        assert!(matches!(read_line(&mut r, limit), Line::TooLarge));
        assert!(
            matches!(read_line(&mut r, limit), Line::Request(l) if l == b"{\"command\":\"status\"}\n")
        );
        assert!(matches!(read_line(&mut r, limit), Line::Eof));
        // A line without its newline at the end of input is not a request.
        let mut r = BufReader::new(&b"{\"command\":\"quit\"}"[..]);
        assert!(matches!(read_line(&mut r, limit), Line::Eof));
    }

    /// A reader whose every read times out after its first bytes, as a
    /// socket with a read timeout does when its client stops mid-line.
    struct Stalled(&'static [u8]);

    impl std::io::Read for Stalled {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let n = self.0.len().min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_partial_line_times_out_and_an_idle_client_does_not() {
        let mut r = BufReader::new(Stalled(b"{\"command\": \"pau"));
        assert!(matches!(read_line(&mut r, Duration::ZERO), Line::TimedOut));
        // Nothing begun: the reader waits on (here, until the line ends).
        struct IdleThenLine(u32);
        impl std::io::Read for IdleThenLine {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.0 += 1;
                if self.0 < 5 {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                let line = b"{\"command\":\"status\"}\n";
                buf[..line.len()].copy_from_slice(line);
                Ok(line.len())
            }
        }
        let mut r = BufReader::new(IdleThenLine(0));
        assert!(matches!(
            read_line(&mut r, Duration::ZERO),
            Line::Request(_)
        ));
    }

    /// Verbs that answer `status` with nothing.
    struct NoVerbs;

    impl Verbs for NoVerbs {
        fn execute(&self, _: Op) -> Result<crate::machine::ops::Reply, OpError> {
            Ok(crate::machine::ops::Reply::Done {})
        }
    }

    #[test]
    fn clients_beyond_the_cap_are_refused_with_a_line() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let socket = listen(&path, Arc::new(NoVerbs)).unwrap();
        let ask = |c: &mut UnixStream| {
            let _ = c.write_all(b"{\"command\":\"status\"}\n");
            let mut line = String::new();
            let _ = BufReader::new(c.try_clone().unwrap()).read_line(&mut line);
            line
        };
        let mut held: Vec<UnixStream> = (0..MAX_CLIENTS)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        // Each is served (so each has its seat).
        for c in &mut held {
            assert!(ask(c).contains("\"ok\":true"));
        }
        let mut extra = UnixStream::connect(&path).unwrap();
        let mut refused = String::new();
        extra.read_to_string(&mut refused).unwrap();
        assert!(refused.contains("too_many_clients"), "{refused}");
        assert_eq!(refused.lines().count(), 1, "{refused}");
        // Once one closes, a new client is served.
        drop(held.pop());
        let mut next = loop {
            let mut c = UnixStream::connect(&path).unwrap();
            let line = ask(&mut c);
            if line.contains("\"ok\":true") {
                break c;
            }
            // The closed client's seat is given back by its thread.
            assert!(
                line.is_empty() || line.contains("too_many_clients"),
                "{line}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(ask(&mut next).contains("\"ok\":true"));
        drop(socket);
        assert!(!path.exists());
    }
}
