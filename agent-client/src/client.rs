//! A blocking client of the guest agent through the VMM's vsock Unix socket
//! (`boot --vsock-uds PATH`): each request is one connection, opened with
//! `CONNECT <port>\n` and answered `OK <host port>\n` by the VMM.
//!
//! The guest is not trusted: every frame is bounded ([`MAX_PAYLOAD`]),
//! collected output and files are bounded by the caller, and every read
//! and write has a timeout but an exec's reads, which wait for the
//! command (bounded by the exec's own timeout, if it has one).

use crate::frame::{
    self, read_frame, AgentErrorPayload, EncodeError, Entry, ExecRequest, Exit, FrameError,
    FrameType, IdentityRequest, Info, Stat, WriteFileRequest, AGENT_PORT, CHUNK,
};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest `OK <port>` answer the VMM sends, newline included.
const OK_LINE_MAX: usize = 32;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The VMM's vsock socket cannot be connected to.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The VMM closed the connection without `OK`: nothing in the guest
    /// listens on the agent's port (yet), or the guest did not answer.
    #[error("no agent answers on vsock port {0}")]
    NoAgent(u32),
    /// Reading or writing the connection failed (a timeout included).
    #[error("agent connection: {0}")]
    Io(#[from] io::Error),
    /// The agent sent bytes that are not a valid frame.
    #[error("agent protocol: {0}")]
    Frame(#[from] FrameError),
    /// The request cannot be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The agent refused or failed the request (an Error frame).
    #[error("the agent answered error {code}: {message}")]
    Guest {
        /// An errno value, or one of [`crate::frame::code`].
        code: u32,
        /// The agent's message.
        message: String,
    },
    /// A frame of a type that does not belong at this point.
    #[error("the agent sent a {0:?} frame during {1}")]
    Unexpected(FrameType, &'static str),
    /// The connection ended before the request's last frame: the agent (or
    /// its connection's process) is gone.
    #[error("the agent closed the connection during {0} without an answer")]
    Closed(&'static str),
    /// The agent did not acknowledge an identity request in time (the
    /// connection may have been reset in the guest alone, as a restore's
    /// transport reset does to connections it finds).
    #[error("the agent did not acknowledge the request in time")]
    NoAck,
    /// The output callback stopped the command (the connection was closed,
    /// so the agent killed it).
    #[error("the command was stopped by its output's reader")]
    Stopped,
    /// More bytes than the caller allows.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What grew too large.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
}

/// Which output stream bytes came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// stdout (in pty mode: the terminal's output).
    Stdout,
    /// stderr.
    Stderr,
}

/// A finished command with its collected output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// Everything it wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything it wrote to stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub exit: Exit,
}

impl Completed {
    /// The exit status, or `128 + N` when signal N killed it (a shell's
    /// convention).
    pub fn exit_code(&self) -> u32 {
        if self.exit.signaled {
            128 + self.exit.code
        } else {
            self.exit.code
        }
    }
}

/// The agent of one VM, reached through the VMM's vsock socket.
#[derive(Clone, Debug)]
pub struct Agent {
    uds: PathBuf,
    port: u32,
    timeout: Duration,
}

impl Agent {
    /// The agent behind `uds` (`boot --vsock-uds`), on [`AGENT_PORT`], with
    /// a 30 s timeout on each read and write.
    pub fn new(uds: impl Into<PathBuf>) -> Self {
        Agent {
            uds: uds.into(),
            port: AGENT_PORT,
            timeout: Duration::from_secs(30),
        }
    }

    /// The same agent with each read and write bounded by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The VMM's socket.
    pub fn uds(&self) -> &Path {
        &self.uds
    }

    /// A new connection to the agent's port (the `CONNECT` handshake done).
    pub fn connect(&self) -> Result<UnixStream, AgentError> {
        let mut s = UnixStream::connect(&self.uds).map_err(|source| AgentError::Connect {
            path: self.uds.clone(),
            source,
        })?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        s.write_all(format!("CONNECT {}\n", self.port).as_bytes())?;
        // A byte at a time: what follows the line is the agent's.
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while line.len() < OK_LINE_MAX {
            match s.read(&mut b) {
                Ok(0) => return Err(AgentError::NoAgent(self.port)),
                Ok(_) if b[0] == b'\n' => break,
                Ok(_) => line.push(b[0]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(AgentError::NoAgent(self.port))
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !line.starts_with(b"OK ") {
            return Err(AgentError::NoAgent(self.port));
        }
        Ok(s)
    }

    /// Connects and sends a request frame.
    fn request(&self, kind: FrameType, payload: &[u8]) -> Result<Conn, AgentError> {
        let mut s = self.connect()?;
        s.write_all(&frame::encode_frame(kind, payload))?;
        Ok(Conn { s, buf: Vec::new() })
    }

    /// The agent's view of the guest.
    pub fn info(&self) -> Result<Info, AgentError> {
        let mut c = self.request(FrameType::Info, &[])?;
        let p = c.expect_ok("info")?;
        Ok(Info::decode(p)?)
    }

    /// Tells the agent the VM's generation ID; it rotates the clone's
    /// identity if the ID is new (see [`IdentityRequest`]) and answers
    /// with its info once done. The agent acknowledges the request at once
    /// (a Started frame); without that within `ack_timeout` the request is
    /// [`AgentError::NoAck`] (safe to repeat: an ID the agent has is not
    /// rotated again).
    pub fn identity(
        &self,
        req: &IdentityRequest,
        ack_timeout: Duration,
    ) -> Result<Info, AgentError> {
        let mut c = self.request(FrameType::Identity, &req.encode()?)?;
        c.s.set_read_timeout(Some(ack_timeout))?;
        match c.next("identity") {
            Ok(FrameType::Started) => frame::decode_u32(&c.buf, "started").map(drop)?,
            Ok(other) => return Err(AgentError::Unexpected(other, "identity")),
            Err(AgentError::Frame(FrameError::Io(e)))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(AgentError::NoAck)
            }
            Err(e) => return Err(e),
        }
        c.s.set_read_timeout(Some(self.timeout))?;
        let p = c.expect_ok("identity")?;
        Ok(Info::decode(p)?)
    }

    /// Runs a command with `stdin` (closed after it; with `req.stdin`
    /// false it must be empty) and collects its output, at most
    /// `max_output` bytes of each stream.
    pub fn exec(
        &self,
        req: &ExecRequest,
        stdin: &[u8],
        max_output: u64,
    ) -> Result<Completed, AgentError> {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let got = self.exec_streaming(req, stdin, &mut |stream, b| {
            let buf = match stream {
                Stream::Stdout => &mut out,
                Stream::Stderr => &mut err,
            };
            if (buf.len() + b.len()) as u64 > max_output {
                return false;
            }
            buf.extend_from_slice(b);
            true
        });
        let exit = match got {
            Err(AgentError::Stopped) => {
                return Err(AgentError::TooLarge {
                    what: "command output",
                    limit: max_output,
                })
            }
            r => r?,
        };
        Ok(Completed {
            stdout: out,
            stderr: err,
            exit,
        })
    }

    /// Runs a command, sending `stdin` from a thread of its own (then its
    /// end) and handing each chunk of output to `output` as it arrives;
    /// `output` returning false kills the command (the connection is
    /// closed). Returns how it ended. Without an exec timeout, reads wait
    /// as long as the command runs.
    pub fn exec_streaming(
        &self,
        req: &ExecRequest,
        stdin: &[u8],
        output: &mut dyn FnMut(Stream, &[u8]) -> bool,
    ) -> Result<Exit, AgentError> {
        if !req.stdin && !stdin.is_empty() {
            return Err(AgentError::Encode(EncodeError::Bad(
                "stdin bytes for an exec without stdin".into(),
            )));
        }
        let mut c = self.request(FrameType::Exec, &req.encode()?)?;
        let wait = match req.timeout_ms {
            0 => None,
            ms => Some(Duration::from_millis(u64::from(ms)) + self.timeout),
        };
        c.s.set_read_timeout(wait)?;
        std::thread::scope(|scope| {
            if req.stdin {
                let mut w = c.s.try_clone()?;
                scope.spawn(move || {
                    // A failed write means the command ended or the
                    // connection broke: the reader reports which.
                    for chunk in stdin.chunks(CHUNK) {
                        if w.write_all(&frame::encode_frame(FrameType::Data, chunk))
                            .is_err()
                        {
                            return;
                        }
                    }
                    let _ = w.write_all(&frame::encode_frame(FrameType::Data, &[]));
                });
            }
            loop {
                let kind = c.next("exec")?;
                match kind {
                    FrameType::Started => {
                        frame::decode_u32(&c.buf, "started")?;
                    }
                    FrameType::Stdout | FrameType::Stderr => {
                        let stream = if kind == FrameType::Stdout {
                            Stream::Stdout
                        } else {
                            Stream::Stderr
                        };
                        if !output(stream, &c.buf) {
                            let _ = c.s.shutdown(std::net::Shutdown::Both);
                            return Err(AgentError::Stopped);
                        }
                    }
                    FrameType::Exit => return Ok(Exit::decode(&c.buf)?),
                    other => return Err(AgentError::Unexpected(other, "exec")),
                }
            }
        })
    }

    /// A guest file's content, at most `max` bytes.
    pub fn read_file(&self, path: &str, max: u64) -> Result<Vec<u8>, AgentError> {
        let mut c = self.request(FrameType::ReadFile, &frame::encode_path(path)?)?;
        let mut data = Vec::new();
        loop {
            match c.next("read_file")? {
                FrameType::FileData => {
                    if (data.len() + c.buf.len()) as u64 > max {
                        return Err(AgentError::TooLarge {
                            what: "the file",
                            limit: max,
                        });
                    }
                    data.extend_from_slice(&c.buf);
                }
                FrameType::Ok => {
                    let n = frame::decode_u64(&c.buf, "read_file")?;
                    if n != data.len() as u64 {
                        return Err(FrameError::Malformed("read_file count").into());
                    }
                    return Ok(data);
                }
                other => return Err(AgentError::Unexpected(other, "read_file")),
            }
        }
    }

    /// Writes `data` to a guest file with permission bits `mode`,
    /// atomically (a temporary file renamed over it).
    pub fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), AgentError> {
        let req = WriteFileRequest {
            path: path.into(),
            mode,
        };
        let mut c = self.request(FrameType::WriteFile, &req.encode()?)?;
        let sent = data
            .chunks(CHUNK)
            .chain(std::iter::once(&[][..]))
            .try_for_each(|chunk| c.s.write_all(&frame::encode_frame(FrameType::Data, chunk)));
        // An early Error frame explains a failed write: read it first.
        let got = c.expect_ok("write_file");
        let p = match (got, sent) {
            (Ok(p), _) => p,
            (Err(e @ AgentError::Guest { .. }), _) => return Err(e),
            (Err(_), Err(e)) => return Err(e.into()),
            (Err(e), Ok(())) => return Err(e),
        };
        if frame::decode_u64(p, "write_file")? != data.len() as u64 {
            return Err(FrameError::Malformed("write_file count").into());
        }
        Ok(())
    }

    /// A guest path's metadata (following symlinks).
    pub fn stat(&self, path: &str) -> Result<Stat, AgentError> {
        let mut c = self.request(FrameType::Stat, &frame::encode_path(path)?)?;
        let p = c.expect_ok("stat")?;
        Ok(Stat::decode(p)?)
    }

    /// A guest directory's entries (not `.` and `..`), at most `max`.
    pub fn list(&self, path: &str, max: usize) -> Result<Vec<Entry>, AgentError> {
        let mut c = self.request(FrameType::List, &frame::encode_path(path)?)?;
        let mut entries = Vec::new();
        loop {
            match c.next("list")? {
                FrameType::Entry => {
                    if entries.len() >= max {
                        return Err(AgentError::TooLarge {
                            what: "the directory listing",
                            limit: max as u64,
                        });
                    }
                    entries.push(Entry::decode(&c.buf)?);
                }
                FrameType::Ok => {
                    if frame::decode_u32(&c.buf, "list")? as usize != entries.len() {
                        return Err(FrameError::Malformed("list count").into());
                    }
                    return Ok(entries);
                }
                other => return Err(AgentError::Unexpected(other, "list")),
            }
        }
    }

    /// A byte stream to guest TCP port `port` on 127.0.0.1, through the
    /// agent (its timeouts cleared: the stream's user sets its own).
    pub fn expose(&self, port: u16) -> Result<UnixStream, AgentError> {
        let mut c = self.request(FrameType::Expose, &frame::encode_expose(port))?;
        let p = c.expect_ok("expose")?;
        frame::decode_empty(p, "expose")?;
        c.s.set_read_timeout(None)?;
        c.s.set_write_timeout(None)?;
        Ok(c.s)
    }
}

/// One request's connection.
struct Conn {
    s: UnixStream,
    buf: Vec<u8>,
}

impl Conn {
    /// The next frame's type (its payload in `buf`); an Error frame is
    /// returned as [`AgentError::Guest`].
    fn next(&mut self, what: &'static str) -> Result<FrameType, AgentError> {
        match read_frame(&mut self.s, &mut self.buf) {
            Ok(Some(FrameType::Error)) => {
                let e = AgentErrorPayload::decode(&self.buf)?;
                Err(AgentError::Guest {
                    code: e.code,
                    message: e.message,
                })
            }
            Ok(Some(kind)) => Ok(kind),
            Ok(None) => Err(AgentError::Closed(what)),
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
                Err(AgentError::Closed(what))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The Ok frame that answers a one-frame request: its payload.
    fn expect_ok(&mut self, what: &'static str) -> Result<&[u8], AgentError> {
        match self.next(what)? {
            FrameType::Ok => Ok(&self.buf),
            other => Err(AgentError::Unexpected(other, what)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_frame, encode_header};
    use std::os::unix::net::UnixListener;
    use std::thread::JoinHandle;

    /// A stand-in VMM socket whose "agent" is `script`: it gets the
    /// connection after the `CONNECT` line (answered `OK 1`, unless
    /// `answer` is false) and plays a hostile or a well-behaved guest.
    fn fake(
        answer: bool,
        script: impl FnOnce(UnixStream) + Send + 'static,
    ) -> (tempfile::TempDir, Agent, JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let l = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut line = [0u8; 13];
            s.read_exact(&mut line).unwrap();
            assert_eq!(&line, b"CONNECT 1024\n");
            if answer {
                s.write_all(b"OK 1073741824\n").unwrap();
                script(s);
            }
        });
        let agent = Agent::new(&path).with_timeout(Duration::from_secs(5));
        (dir, agent, t)
    }

    fn true_cmd() -> ExecRequest {
        ExecRequest {
            argv: vec!["cat".into()],
            stdin: true,
            ..Default::default()
        }
    }

    fn read_request(s: &mut UnixStream) -> (FrameType, Vec<u8>) {
        let mut p = Vec::new();
        let t = read_frame(s, &mut p).unwrap().unwrap();
        (t, p)
    }

    #[test]
    fn no_listener_in_the_guest_is_no_agent() {
        let (_d, agent, t) = fake(false, |_| {});
        assert!(matches!(agent.info(), Err(AgentError::NoAgent(1024))));
        t.join().unwrap();
    }

    #[test]
    fn an_exec_streams_stdin_out_and_its_exit() {
        let (_d, agent, t) = fake(true, |mut s| {
            let (kind, p) = read_request(&mut s);
            assert_eq!(kind, FrameType::Exec);
            assert_eq!(p, true_cmd().encode().unwrap());
            let (kind, p) = read_request(&mut s);
            assert_eq!((kind, &p[..]), (FrameType::Data, &b"in"[..]));
            let (kind, p) = read_request(&mut s);
            assert_eq!((kind, p.len()), (FrameType::Data, 0));
            s.write_all(&encode_frame(FrameType::Started, &7u32.to_le_bytes()))
                .unwrap();
            s.write_all(&encode_frame(FrameType::Stdout, b"in"))
                .unwrap();
            s.write_all(&encode_frame(FrameType::Stderr, b"e")).unwrap();
            s.write_all(&encode_frame(FrameType::Exit, &[0, 0, 0, 0, 3, 0, 0, 0]))
                .unwrap();
        });
        let done = agent.exec(&true_cmd(), b"in", 100).unwrap();
        assert_eq!(done.stdout, b"in");
        assert_eq!(done.stderr, b"e");
        assert_eq!(done.exit_code(), 3);
        t.join().unwrap();
    }

    #[test]
    fn an_agent_gone_mid_exec_is_reported() {
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            s.write_all(&encode_frame(FrameType::Stdout, b"partial"))
                .unwrap();
        });
        let req = ExecRequest {
            argv: vec!["sleep".into(), "9".into()],
            ..Default::default()
        };
        assert!(matches!(
            agent.exec(&req, b"", 100),
            Err(AgentError::Closed("exec"))
        ));
        t.join().unwrap();
    }

    #[test]
    fn hostile_frames_are_errors_not_allocations_or_hangs() {
        // An oversized header.
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            let mut h = encode_header(FrameType::Ok, 0);
            h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            s.write_all(&h).unwrap();
        });
        assert!(matches!(
            agent.info(),
            Err(AgentError::Frame(FrameError::TooLong(_)))
        ));
        t.join().unwrap();
        // More output than allowed.
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            for _ in 0..3 {
                if s.write_all(&encode_frame(FrameType::Stdout, &[0; 64]))
                    .is_err()
                {
                    return;
                }
            }
        });
        let req = ExecRequest {
            argv: vec!["yes".into()],
            ..Default::default()
        };
        assert!(matches!(
            agent.exec(&req, b"", 100),
            Err(AgentError::TooLarge { limit: 100, .. })
        ));
        t.join().unwrap();
        // A frame that does not belong.
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            s.write_all(&encode_frame(FrameType::Stdout, b"x")).unwrap();
        });
        assert!(matches!(
            agent.stat("/"),
            Err(AgentError::Unexpected(FrameType::Stdout, "stat"))
        ));
        t.join().unwrap();
        // A guest that never answers: the read times out.
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            std::thread::sleep(Duration::from_millis(500));
        });
        let agent = agent.with_timeout(Duration::from_millis(100));
        assert!(matches!(
            agent.info(),
            Err(AgentError::Frame(FrameError::Io(_)))
        ));
        t.join().unwrap();
    }

    #[test]
    fn guest_errors_and_byte_counts_are_checked() {
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            let mut p = 2u32.to_le_bytes().to_vec();
            p.extend_from_slice(&4u32.to_le_bytes());
            p.extend_from_slice(b"gone");
            s.write_all(&encode_frame(FrameType::Error, &p)).unwrap();
        });
        match agent.read_file("/x", 10) {
            Err(AgentError::Guest { code: 2, message }) => assert_eq!(message, "gone"),
            other => panic!("{other:?}"),
        }
        t.join().unwrap();
        // A count that does not match the data sent.
        let (_d, agent, t) = fake(true, |mut s| {
            read_request(&mut s);
            s.write_all(&encode_frame(FrameType::FileData, b"abc"))
                .unwrap();
            s.write_all(&encode_frame(FrameType::Ok, &4u64.to_le_bytes()))
                .unwrap();
        });
        assert!(matches!(
            agent.read_file("/x", 10),
            Err(AgentError::Frame(FrameError::Malformed(_)))
        ));
        t.join().unwrap();
    }
}
