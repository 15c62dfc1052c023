//! The console front-end's input: a byte stream (the host's stdin, or a
//! socket console's attached client), its escape keys (each a verb,
//! [`crate::machine::ops`]), and the guest UART it feeds.

use crate::console::{self, EscapeParser, Key};
use crate::machine::ops::{Op, SnapshotWait, Verbs};
use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// The guest's console UART as the input thread feeds it.
pub trait Uart: Send + Sync {
    /// Hands input to the UART's receive FIFO; returns how many leading
    /// bytes it took.
    fn input(&self, bytes: &[u8]) -> usize;
    /// Whether the VM has ended (nothing more is fed).
    fn ended(&self) -> bool;
}

/// Why [`pump`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputEnd {
    /// The stream ended (or failed).
    Eof,
    /// `Ctrl-A x`: the VM was asked to quit.
    Quit,
    /// `Ctrl-A d` on a stream that can detach.
    Detach,
}

/// Reads `input` until it ends, turning the escape keys into verbs on
/// `verbs` and feeding the rest to `uart` at the pace its receive FIFO
/// drains. `Ctrl-A s` snapshots after the input typed before it has reached
/// the guest, and goes on once the guest runs again. `Ctrl-A d` ends the
/// pump if `detachable`, and is dropped otherwise (a terminal).
pub fn pump(
    input: &mut dyn Read,
    verbs: &dyn Verbs,
    uart: &dyn Uart,
    detachable: bool,
) -> InputEnd {
    let mut parser = EscapeParser::default();
    let mut buf = [0u8; 256];
    let mut pending = VecDeque::new();
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) | Err(_) => return InputEnd::Eof,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            match parser.feed(b) {
                Key::Guest(b) => pending.push_back(b),
                Key::Quit => {
                    let _ = verbs.execute(Op::Quit);
                    return InputEnd::Quit;
                }
                Key::Help => console::message(console::ESCAPE_HELP.trim_end()),
                Key::Snapshot => {
                    feed(uart, &mut pending);
                    // The console has the outcome.
                    let _ = verbs.execute(Op::Snapshot {
                        name: None,
                        wait: SnapshotWait::Resumed,
                    });
                }
                Key::Detach if detachable => {
                    feed(uart, &mut pending);
                    return InputEnd::Detach;
                }
                Key::Detach | Key::None => {}
            }
        }
        feed(uart, &mut pending);
    }
}

/// Reads the host's stdin on a thread ([`pump`]).
pub fn spawn(verbs: Arc<dyn Verbs>, uart: Arc<dyn Uart>) {
    let spawned = std::thread::Builder::new()
        .name("console".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            pump(&mut stdin, &*verbs, &*uart, false);
        });
    if let Err(e) = spawned {
        tracing::warn!("no console input: cannot spawn the console thread: {e}");
    }
}

/// Moves `pending` input into the UART's receive FIFO as space frees up.
fn feed(uart: &dyn Uart, pending: &mut VecDeque<u8>) {
    while !pending.is_empty() && !uart.ended() {
        let bytes = pending.make_contiguous();
        let taken = uart.input(bytes);
        pending.drain(..taken);
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::ops::{OpError, Reply};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Record {
        ops: Mutex<Vec<Op>>,
        fed: Mutex<Vec<u8>>,
    }

    impl Verbs for Record {
        fn execute(&self, op: Op) -> Result<Reply, OpError> {
            self.ops.lock().unwrap().push(op);
            Ok(Reply::Done {})
        }
    }

    impl Uart for Record {
        fn input(&self, bytes: &[u8]) -> usize {
            self.fed.lock().unwrap().extend_from_slice(bytes);
            bytes.len()
        }
        fn ended(&self) -> bool {
            false
        }
    }

    #[test]
    fn escapes_become_verbs_and_the_rest_reaches_the_uart() {
        let r = Record::default();
        let input = b"ls\x01s\x01a\x01qpwd\x01x after";
        let end = pump(&mut &input[..], &r, &r, true);
        assert_eq!(end, InputEnd::Quit);
        // What came before the snapshot reached the guest first; after the
        // quit, nothing does.
        assert_eq!(*r.fed.lock().unwrap(), b"ls");
        let r2 = Record::default();
        pump(&mut &b"a\x01ab\x01qc"[..], &r2, &r2, true);
        assert_eq!(*r2.fed.lock().unwrap(), b"a\x01bc");
        assert_eq!(
            *r.ops.lock().unwrap(),
            [
                Op::Snapshot {
                    name: None,
                    wait: SnapshotWait::Resumed
                },
                Op::Quit
            ]
        );
    }

    #[test]
    fn detach_ends_a_detachable_stream_only() {
        let r = Record::default();
        assert_eq!(pump(&mut &b"a\x01db"[..], &r, &r, true), InputEnd::Detach);
        assert_eq!(*r.fed.lock().unwrap(), b"a");
        let r = Record::default();
        assert_eq!(pump(&mut &b"a\x01db"[..], &r, &r, false), InputEnd::Eof);
        assert_eq!(*r.fed.lock().unwrap(), b"ab");
        assert!(r.ops.lock().unwrap().is_empty());
    }
}
