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
//! ```
//!
//! Responses are `{"ok": true, "result": {...}}` or `{"ok": false, "error":
//! {"code": CODE, "message": "..."}}` with CODE one of [`ErrorCode`]'s. A
//! request line is at most [`MAX_REQUEST_BYTES`]; a longer, malformed or
//! unknown request gets an error and changes nothing. Several clients may be
//! connected, each served on its own thread: one client's long request (a
//! snapshot) holds back only requests that must wait for it, never another
//! client's `status`. A client that goes away mid-request changes nothing
//! but what the request did. The protocol is documented, with a schema, in
//! the book's control-socket chapter.
//!
//! This is a front-end: each request is a verb ([`crate::machine::ops`]).

use crate::machine::ops::{Op, OpError, SnapshotWait, Verbs};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

/// Longest request line, in bytes (newline included).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Error codes of the control socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, or not a request object.
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
}

impl ErrorCode {
    /// The code of a verb's error.
    fn of(e: &OpError) -> Self {
        match e {
            OpError::Pause(_) => ErrorCode::Refused,
            OpError::Snapshot(_) => ErrorCode::SnapshotFailed,
        }
    }
}

/// A request.
#[derive(Debug, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Snapshot {
        #[serde(default)]
        name: Option<String>,
    },
    Pause,
    Resume,
    Status,
    Quit,
}

impl From<Request> for Op {
    fn from(r: Request) -> Op {
        match r {
            Request::Snapshot { name } => Op::Snapshot {
                name,
                wait: SnapshotWait::Committed,
            },
            Request::Pause => Op::Pause,
            Request::Resume => Op::Resume,
            Request::Status => Op::Status,
            Request::Quit => Op::Quit,
        }
    }
}

const COMMANDS: [&str; 5] = ["snapshot", "pause", "resume", "status", "quit"];

/// Requests being answered, counted so that the VM's end waits for their
/// answers.
#[derive(Default)]
struct InFlight {
    count: Mutex<usize>,
    done: Condvar,
}

/// The socket file (removed when dropped) and the requests in flight on it.
pub struct Socket {
    path: PathBuf,
    in_flight: Arc<InFlight>,
}

impl Socket {
    /// Waits until every request being answered has its answer written
    /// (the VM has ended: verbs still arriving are refused at once).
    pub fn drain(&self) {
        let mut n = crate::sync::Locked::locked(&self.in_flight.count);
        while *n > 0 {
            n = crate::sync::Waited::waited(&self.in_flight.done, n);
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` (replacing a stale socket there, refusing a live one
/// or any other file) and serves `verbs` on a thread per client.
pub fn listen(path: &Path, verbs: Arc<dyn Verbs>) -> anyhow::Result<Socket> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                anyhow::bail!(
                    "control socket {} is in use by another process",
                    path.display()
                );
            }
            std::fs::remove_file(path).map_err(|e| {
                anyhow::anyhow!("cannot remove stale socket {}: {e}", path.display())
            })?;
        }
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; choose another --control path",
            path.display()
        ),
        Err(_) => {}
    }
    // Owner-only from the start: no other user may connect in between.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener =
        bound.map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    let in_flight = Arc::new(InFlight::default());
    let flights = in_flight.clone();
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let (verbs, flights) = (verbs.clone(), flights.clone());
                let _ = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || serve(&*verbs, &flights, stream));
            }
        })?;
    Ok(Socket {
        path: path.to_path_buf(),
        in_flight,
    })
}

/// Serves one client until it disconnects.
fn serve(verbs: &dyn Verbs, in_flight: &InFlight, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut input = BufReader::new(stream);
    loop {
        let line = match read_line(&mut input) {
            Line::Eof => return,
            Line::TooLarge => error(
                ErrorCode::TooLarge,
                format!("request longer than {MAX_REQUEST_BYTES} bytes"),
            ),
            Line::Request(bytes) => {
                *crate::sync::Locked::locked(&in_flight.count) += 1;
                let answer = handle(verbs, &bytes);
                let written = writeln!(out, "{answer}");
                *crate::sync::Locked::locked(&in_flight.count) -= 1;
                in_flight.done.notify_all();
                if written.is_err() {
                    return;
                }
                continue;
            }
        };
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
}

/// A line read from a client.
enum Line {
    Request(Vec<u8>),
    TooLarge,
    Eof,
}

/// Reads one line of at most [`MAX_REQUEST_BYTES`]; a longer one is read to
/// its end and dropped.
fn read_line(input: &mut impl BufRead) -> Line {
    let mut line = Vec::new();
    let mut too_large = false;
    loop {
        let buf = match input.fill_buf() {
            Ok([]) | Err(_) => return Line::Eof,
            Ok(b) => b,
        };
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
    }
}

/// Answers one request line.
fn handle(verbs: &dyn Verbs, bytes: &[u8]) -> String {
    let req = match parse(bytes) {
        Ok(r) => r,
        Err((code, message)) => return error(code, message),
    };
    match verbs.execute(req.into()) {
        Ok(reply) => serde_json::json!({"ok": true, "result": reply}).to_string(),
        Err(e) => error(ErrorCode::of(&e), e.to_string()),
    }
}

/// Parses a request line, telling a bad request from an unknown command.
fn parse(bytes: &[u8]) -> Result<Request, (ErrorCode, String)> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| (ErrorCode::BadRequest, format!("not JSON: {e}")))?;
    match value.get("command") {
        Some(serde_json::Value::String(c)) if !COMMANDS.contains(&c.as_str()) => {
            return Err((
                ErrorCode::UnknownCommand,
                format!("unknown command '{c}' (commands: {})", COMMANDS.join(", ")),
            ));
        }
        Some(serde_json::Value::String(c)) => {
            // serde lets unit variants ignore extra keys: check them here.
            let allowed: &[&str] = if c == "snapshot" {
                &["command", "name"]
            } else {
                &["command"]
            };
            let keys = value.as_object().map(|o| o.keys()).into_iter().flatten();
            if let Some(k) = keys.into_iter().find(|k| !allowed.contains(&k.as_str())) {
                return Err((
                    ErrorCode::BadRequest,
                    format!("unknown field '{k}' in a '{c}' request"),
                ));
            }
        }
        _ => {
            return Err((
                ErrorCode::BadRequest,
                "a request is an object with a string \"command\"".into(),
            ))
        }
    }
    serde_json::from_value(value).map_err(|e| (ErrorCode::BadRequest, e.to_string()))
}

fn error(code: ErrorCode, message: String) -> String {
    serde_json::json!({"ok": false, "error": {"code": code, "message": message}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(bytes: &[u8]) -> Option<ErrorCode> {
        parse(bytes).err().map(|e| e.0)
    }

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        assert!(matches!(
            parse(br#"{"command":"snapshot","name":"a"}"#),
            Ok(Request::Snapshot { name: Some(n) }) if n == "a"
        ));
        assert!(matches!(
            parse(br#"{"command":"snapshot"}"#),
            Ok(Request::Snapshot { name: None })
        ));
        assert!(matches!(
            parse(b"{\"command\":\"status\"}\n"),
            Ok(Request::Status)
        ));
        assert_eq!(code(b"{"), Some(ErrorCode::BadRequest));
        assert_eq!(code(b"[1]"), Some(ErrorCode::BadRequest));
        assert_eq!(code(br#"{"command":7}"#), Some(ErrorCode::BadRequest));
        assert_eq!(
            code(br#"{"command":"reboot"}"#),
            Some(ErrorCode::UnknownCommand)
        );
        assert_eq!(
            code(br#"{"command":"pause","x":1}"#),
            Some(ErrorCode::BadRequest)
        );
        assert_eq!(
            code(br#"{"command":"snapshot","name":3}"#),
            Some(ErrorCode::BadRequest)
        );
    }

    #[test]
    fn lines_are_bounded() {
        let mut big = vec![b'x'; MAX_REQUEST_BYTES + 10];
        big.push(b'\n');
        big.extend_from_slice(b"{\"command\":\"status\"}\n");
        let mut r = BufReader::with_capacity(1000, &big[..]);
        assert!(matches!(read_line(&mut r), Line::TooLarge));
        assert!(
            matches!(read_line(&mut r), Line::Request(l) if l == b"{\"command\":\"status\"}\n")
        );
        assert!(matches!(read_line(&mut r), Line::Eof));
        // A line without its newline at the end of input is not a request.
        let mut r = BufReader::new(&b"{\"command\":\"quit\"}"[..]);
        assert!(matches!(read_line(&mut r), Line::Eof));
    }
}
