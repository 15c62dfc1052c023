//! A socket console, `boot --console socket:PATH`: the guest's console on a
//! Unix stream socket (mode 0600), as a serial console server offers it.
//!
//! One client at a time is attached: it reads the guest's output (and the
//! VMM's messages) and types the guest's input, with the terminal's Ctrl-A
//! escapes ([`crate::console`]); `Ctrl-A d`, or closing the connection,
//! detaches it. A client that connects while another is attached is told so
//! in one line and closed: the attached one keeps the console (it detaches
//! to let another in).
//!
//! The VM never waits for a client: the output goes into a ring of the last
//! [`RING_BYTES`] bytes, whatever is attached. A client that attaches gets
//! the ring first (what was written while no one was attached, as far back
//! as it holds), then the output as it comes. Each client has its own thread
//! that sends it the ring's new bytes; one that falls more than the ring
//! behind is told how many bytes it missed, and one whose socket accepts
//! nothing for [`SEND_TIMEOUT`] is detached.

use crate::console::MessageEcho;
use crate::machine::console_input::{pump, InputEnd, Uart};
use crate::machine::ops::Verbs;
use crate::sync::{Locked, Waited};
use std::collections::VecDeque;
use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of output the console keeps for a client that attaches later.
pub const RING_BYTES: usize = 64 * 1024;

/// How long a send to a client may wait for it to read; then it is
/// detached.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the VM's end waits for the attached client to be sent the last
/// output.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// The line a client gets when another is attached.
pub const BUSY: &str = "[console] busy: another client is attached (it detaches with Ctrl-A d)";

/// The output ring and who is attached.
struct State {
    ring: VecDeque<u8>,
    /// Bytes ever written (the ring holds the last of them).
    total: u64,
    /// The attached client's number, if one is attached.
    attached: Option<u64>,
    /// Clients attached so far (numbers the next).
    clients: u64,
    /// The VM has ended: the client is sent what is left and closed.
    ended: bool,
    /// Where the attached client's sender is (its `total` so far).
    sent: u64,
}

/// What the console's threads share.
struct Shared {
    state: Mutex<State>,
    /// New output, a detach, or the end.
    changed: Condvar,
}

impl Shared {
    fn append(&self, bytes: &[u8]) {
        let mut s = self.state.locked();
        s.ring.extend(bytes);
        let over = s.ring.len().saturating_sub(RING_BYTES);
        s.ring.drain(..over);
        s.total += bytes.len() as u64;
        drop(s);
        self.changed.notify_all();
    }
}

/// The guest's console output, for the UART: into the ring.
pub struct Output(Arc<Shared>);

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The console socket (its file removed when dropped).
pub struct ConsoleSocket {
    path: PathBuf,
    shared: Arc<Shared>,
    listener: Option<std::os::unix::net::UnixListener>,
}

impl ConsoleSocket {
    /// Listens on `path` (mode 0600; a stale socket there replaced, a live
    /// one or any other file refused: [`crate::host_socket::listen`]).
    /// Nothing is served until [`ConsoleSocket::serve`].
    pub fn listen(path: &Path) -> anyhow::Result<Self> {
        let listener = crate::host_socket::listen(path)
            .map_err(|e| anyhow::anyhow!("--console socket:{}: {e}", path.display()))?;
        Ok(ConsoleSocket {
            path: path.to_path_buf(),
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ring: VecDeque::with_capacity(RING_BYTES),
                    total: 0,
                    attached: None,
                    clients: 0,
                    ended: false,
                    sent: 0,
                }),
                changed: Condvar::new(),
            }),
            listener: Some(listener),
        })
    }

    /// The guest's output end (the UART writes here).
    pub fn output(&self) -> Output {
        Output(self.shared.clone())
    }

    /// What to call with each VMM message (they go to the ring too).
    pub fn echo(&self) -> MessageEcho {
        let shared = self.shared.clone();
        Arc::new(move |b: &[u8]| shared.append(b))
    }

    /// Accepts clients on a thread: the first one attaches, later ones are
    /// refused while it is ([`BUSY`]); an attached client's input goes to
    /// `uart`, its escapes to `verbs`.
    pub fn serve(&mut self, verbs: Arc<dyn Verbs>, uart: Arc<dyn Uart>) -> anyhow::Result<()> {
        let Some(listener) = self.listener.take() else {
            anyhow::bail!("the console socket is served already");
        };
        let shared = self.shared.clone();
        std::thread::Builder::new()
            .name("console-socket".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    attach(&shared, stream, verbs.clone(), uart.clone());
                }
            })?;
        Ok(())
    }

    /// The VM has ended: the attached client is sent the output left (for
    /// at most [`DRAIN_WAIT`]) and closed, and no one attaches any more.
    pub fn finish(&self) {
        let mut s = self.shared.state.locked();
        s.ended = true;
        self.shared.changed.notify_all();
        let t = Instant::now();
        while s.attached.is_some() && t.elapsed() < DRAIN_WAIT {
            s = self
                .shared
                .changed
                .wait_timeout(s, Duration::from_millis(50))
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Attaches `stream` if no one is, with a thread that sends it the output
/// and one that reads its input; else tells it [`BUSY`] and closes it.
fn attach(
    shared: &Arc<Shared>,
    mut stream: UnixStream,
    verbs: Arc<dyn Verbs>,
    uart: Arc<dyn Uart>,
) {
    let mut s = shared.state.locked();
    if s.attached.is_some() || s.ended {
        let line = if s.ended {
            "[console] the VM has ended"
        } else {
            BUSY
        };
        drop(s);
        // A new socket's send buffer is empty: the line fits without waiting.
        let _ = stream.set_nonblocking(true);
        let _ = write!(stream, "{line}\r\n");
        return;
    }
    s.clients += 1;
    let me = s.clients;
    s.attached = Some(me);
    // The ring's bytes first.
    s.sent = s.total - s.ring.len() as u64;
    drop(s);
    let (Ok(out), Ok(()), Ok(())) = (
        stream.try_clone(),
        stream.set_write_timeout(Some(SEND_TIMEOUT)),
        stream.set_read_timeout(None),
    ) else {
        detach(shared, me, &stream);
        return;
    };
    let sender = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("console-out".into())
        .spawn(move || send(&sender, me, out));
    if spawned.is_err() {
        detach(shared, me, &stream);
        return;
    }
    let reader = shared.clone();
    let _ = std::thread::Builder::new()
        .name("console-in".into())
        .spawn(move || {
            let mut input = &stream;
            if pump(&mut input, &*verbs, &*uart, true) == InputEnd::Detach {
                let _ = (&stream).write_all(b"\r\n[console] detached\r\n");
            }
            detach(&reader, me, &stream);
        });
}

/// Client `me` is no longer attached: its connection is shut down (which
/// ends its other thread) and the console is free.
fn detach(shared: &Shared, me: u64, stream: &UnixStream) {
    let _ = stream.shutdown(Shutdown::Both);
    let mut s = shared.state.locked();
    if s.attached == Some(me) {
        s.attached = None;
    }
    drop(s);
    shared.changed.notify_all();
}

/// Sends client `me` the ring's new bytes as they come, until it detaches,
/// a send fails or times out, or the VM has ended and all is sent.
fn send(shared: &Shared, me: u64, mut out: UnixStream) {
    let banner = b"[console] attached: Ctrl-A d detaches, Ctrl-A h lists the escapes\r\n";
    if out.write_all(banner).is_err() {
        return detach(shared, me, &out);
    }
    loop {
        let mut s = shared.state.locked();
        while s.attached == Some(me) && s.sent == s.total && !s.ended {
            s = shared.changed.waited(s);
        }
        if s.attached != Some(me) {
            return;
        }
        if s.ended && s.sent == s.total {
            drop(s);
            return detach(shared, me, &out);
        }
        let first = s.total - s.ring.len() as u64;
        let missed = first.saturating_sub(s.sent);
        let from = (s.sent.max(first) - first) as usize;
        let (a, b) = s.ring.as_slices();
        let mut bytes = Vec::with_capacity(s.ring.len() - from);
        if from < a.len() {
            bytes.extend_from_slice(&a[from..]);
            bytes.extend_from_slice(b);
        } else {
            bytes.extend_from_slice(&b[from - a.len()..]);
        }
        s.sent = s.total;
        drop(s);
        if missed > 0 {
            let note = format!(
                "\r\n[console] {missed} bytes of output were lost (the client read too slowly)\r\n"
            );
            if out.write_all(note.as_bytes()).is_err() {
                return detach(shared, me, &out);
            }
        }
        if out.write_all(&bytes).is_err() {
            return detach(shared, me, &out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::ops::{Op, OpError, Reply};
    use std::io::{BufRead, BufReader, Read};

    #[derive(Default)]
    struct Fake {
        ops: Mutex<Vec<Op>>,
        fed: Mutex<Vec<u8>>,
    }

    impl Verbs for Fake {
        fn execute(&self, op: Op) -> Result<Reply, OpError> {
            self.ops.lock().unwrap().push(op);
            Ok(Reply::Done {})
        }
    }

    impl Uart for Fake {
        fn input(&self, bytes: &[u8]) -> usize {
            self.fed.lock().unwrap().extend_from_slice(bytes);
            bytes.len()
        }
        fn ended(&self) -> bool {
            false
        }
    }

    fn console() -> (tempfile::TempDir, ConsoleSocket, Arc<Fake>) {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ConsoleSocket::listen(&dir.path().join("console.sock")).unwrap();
        let fake = Arc::new(Fake::default());
        c.serve(fake.clone(), fake.clone()).unwrap();
        (dir, c, fake)
    }

    /// Reads `stream` until `want` has been read; returns everything read.
    fn read_until(stream: &mut UnixStream, want: &str) -> String {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(want) {
            let n = stream.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "closed before {want:?}; read {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    #[test]
    fn output_written_while_detached_is_replayed_and_a_second_client_refused() {
        let (dir, c, fake) = console();
        let path = dir.path().join("console.sock");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let mut out = c.output();
        out.write_all(b"before attach\r\n").unwrap();
        let mut a = UnixStream::connect(&path).unwrap();
        read_until(&mut a, "before attach");
        out.write_all(b"live\r\n").unwrap();
        read_until(&mut a, "live");
        // A second client is refused with a line, and the first keeps going.
        let b = UnixStream::connect(&path).unwrap();
        let mut line = String::new();
        BufReader::new(b).read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), BUSY);
        a.write_all(b"typed\x01d").unwrap();
        read_until(&mut a, "[console] detached");
        assert_eq!(*fake.fed.lock().unwrap(), b"typed");
        // Detached: output goes on into the ring, and the next client gets it.
        out.write_all(b"while detached\r\n").unwrap();
        let mut b = UnixStream::connect(&path).unwrap();
        let got = read_until(&mut b, "while detached");
        assert!(got.contains("before attach"), "{got}");
        // Ctrl-A s and Ctrl-A x are the terminal's verbs.
        b.write_all(b"\x01s\x01x").unwrap();
        let t = Instant::now();
        while fake.ops.lock().unwrap().len() < 2 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(matches!(
            fake.ops.lock().unwrap()[..],
            [Op::Snapshot { .. }, Op::Quit]
        ));
        drop(c);
        assert!(!path.exists(), "the socket file is removed");
    }

    #[test]
    fn the_ring_keeps_the_last_bytes_and_the_vm_s_end_closes_the_client() {
        let (dir, c, _) = console();
        let mut out = c.output();
        for i in 0..RING_BYTES / 1000 + 20 {
            writeln!(out, "{i:0999}").unwrap();
        }
        let mut a = UnixStream::connect(dir.path().join("console.sock")).unwrap();
        let last = format!("{:0999}\n", RING_BYTES / 1000 + 19);
        let got = read_until(&mut a, &last);
        // Only the last RING_BYTES: the first lines are gone.
        assert!(!got.contains(&format!("{:0999}", 0)), "the ring is bounded");
        assert!(got.len() <= RING_BYTES + 200, "{}", got.len());
        // The VM's end: the client is sent the rest and closed.
        out.write_all(b"power down\r\n").unwrap();
        c.finish();
        let mut rest = String::new();
        a.read_to_string(&mut rest).unwrap();
        assert!(
            rest.contains("power down") || got.contains("power down"),
            "{rest}"
        );
    }
}
