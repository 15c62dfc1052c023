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
//! connected; their requests are served one at a time. A client that goes
//! away mid-request changes nothing but what the request did. The protocol
//! is documented, with a schema, in the book's control-socket chapter.

use crate::machine::snapshot::save::Written;
use crate::machine::{Shared, VmExit};
use crate::sync::Locked;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Longest request line, in bytes (newline included).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// What the control socket can do to the VM (the snapshotter implements it).
pub(in crate::machine) trait Operations: Send {
    /// Writes a snapshot and returns it once it is in the store.
    fn snapshot(&mut self, name: Option<String>) -> Result<Written, String>;
    /// Pauses the VM.
    fn pause(&mut self) -> Result<(), String>;
    /// Resumes a paused VM.
    fn resume(&mut self) -> Result<(), String>;
    /// Whether the VM is paused.
    fn paused(&self) -> bool;
    /// The layer the next snapshot is a diff against.
    fn parent(&self) -> Option<String>;
    /// Pages a diff written now would hold.
    fn dirty_pages(&self) -> usize;
    /// Whether a background layer is being written.
    fn writing(&self) -> bool;
}

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

const COMMANDS: [&str; 5] = ["snapshot", "pause", "resume", "status", "quit"];

/// The result of `status`.
#[derive(Debug, Serialize)]
struct Status {
    /// `running` or `paused`.
    state: &'static str,
    vcpus: usize,
    backend: &'static str,
    /// Since `boot` started the VM, in ms.
    uptime_ms: u64,
    /// The `--restore` spec, if the VM was restored.
    restored_from: Option<String>,
    /// The layer the next snapshot is a diff against (`null`: it is a full
    /// one).
    parent: Option<String>,
    /// 16 KiB pages a diff written now would hold.
    dirty_pages: usize,
    /// A background layer is being written.
    snapshot_in_progress: bool,
}

/// What the control socket serves from.
pub(in crate::machine) struct Api {
    pub(in crate::machine) shared: Arc<Shared>,
    pub(in crate::machine) ops: Arc<Mutex<dyn Operations>>,
    pub(in crate::machine) vcpus: usize,
    pub(in crate::machine) backend: &'static str,
    pub(in crate::machine) started: Instant,
    pub(in crate::machine) restored_from: Option<String>,
}

/// The socket file, removed when dropped.
pub(in crate::machine) struct Socket {
    path: PathBuf,
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` (replacing a stale socket there, refusing a live one
/// or any other file) and serves `api` on a thread per client.
pub(in crate::machine) fn listen(path: &Path, api: Api) -> anyhow::Result<Socket> {
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
    let api = Arc::new(api);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let api = api.clone();
                let _ = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || serve(&api, stream));
            }
        })?;
    Ok(Socket {
        path: path.to_path_buf(),
    })
}

/// Serves one client until it disconnects (or the VM ends).
fn serve(api: &Api, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut input = BufReader::new(stream);
    loop {
        let (line, quit) = match read_line(&mut input) {
            Line::Eof => return,
            Line::TooLarge => (
                error(
                    ErrorCode::TooLarge,
                    format!("request longer than {MAX_REQUEST_BYTES} bytes"),
                ),
                false,
            ),
            Line::Request(bytes) => handle(api, &bytes),
        };
        if writeln!(out, "{line}").is_err() {
            return;
        }
        if quit {
            api.shared.control.finish(VmExit::Quit);
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

/// Answers one request line; whether the VM must quit after the answer.
fn handle(api: &Api, bytes: &[u8]) -> (String, bool) {
    let req = match parse(bytes) {
        Ok(r) => r,
        Err((code, message)) => return (error(code, message), false),
    };
    let quit = matches!(req, Request::Quit);
    let result = match req {
        Request::Snapshot { name } => api
            .ops
            .locked()
            .snapshot(name)
            .map(|w| serde_json::to_value(w).expect("serialisable"))
            .map_err(|e| (ErrorCode::SnapshotFailed, e)),
        Request::Pause => unit(api.ops.locked().pause()),
        Request::Resume => unit(api.ops.locked().resume()),
        Request::Status => Ok(serde_json::to_value(status(api)).expect("serialisable")),
        Request::Quit => Ok(serde_json::json!({})),
    };
    match result {
        Ok(v) => (
            serde_json::json!({"ok": true, "result": v}).to_string(),
            quit,
        ),
        Err((code, message)) => (error(code, message), false),
    }
}

fn unit(r: Result<(), String>) -> Result<serde_json::Value, (ErrorCode, String)> {
    r.map(|()| serde_json::json!({}))
        .map_err(|e| (ErrorCode::Refused, e))
}

fn status(api: &Api) -> Status {
    let ops = api.ops.locked();
    Status {
        state: if ops.paused() { "paused" } else { "running" },
        vcpus: api.vcpus,
        backend: api.backend,
        uptime_ms: api.started.elapsed().as_millis() as u64,
        restored_from: api.restored_from.clone(),
        parent: ops.parent(),
        dirty_pages: ops.dirty_pages(),
        snapshot_in_progress: ops.writing(),
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
