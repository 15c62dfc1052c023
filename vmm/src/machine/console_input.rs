//! The console front-end: the host's stdin, its escape keys (each a verb,
//! [`crate::machine::ops`]), and the guest UART it feeds.

use crate::console::{self, EscapeParser, Key};
use crate::machine::ops::{Op, SnapshotWait, Verbs};
use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// The guest's console UART as the input thread feeds it.
pub trait Uart: Send {
    /// Hands input to the UART's receive FIFO; returns how many leading
    /// bytes it took.
    fn input(&self, bytes: &[u8]) -> usize;
    /// Whether the VM has ended (nothing more is fed).
    fn ended(&self) -> bool;
}

/// Reads the host's stdin on a thread, turns the escape keys into verbs on
/// `verbs`, and feeds the rest to `uart` at the pace its receive FIFO
/// drains. `Ctrl-A s` snapshots after the input typed before it has reached
/// the guest, and goes on once the guest runs again.
pub fn spawn(verbs: Arc<dyn Verbs>, uart: Box<dyn Uart>) {
    let spawned = std::thread::Builder::new()
        .name("console".into())
        .spawn(move || {
            let mut parser = EscapeParser::default();
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 256];
            let mut pending = VecDeque::new();
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    match parser.feed(b) {
                        Key::Guest(b) => pending.push_back(b),
                        Key::Quit => {
                            let _ = verbs.execute(Op::Quit);
                            return;
                        }
                        Key::Help => console::message(console::ESCAPE_HELP.trim_end()),
                        Key::Snapshot => {
                            feed(&*uart, &mut pending);
                            // The console has the outcome.
                            let _ = verbs.execute(Op::Snapshot {
                                name: None,
                                wait: SnapshotWait::Resumed,
                            });
                        }
                        Key::None => {}
                    }
                }
                feed(&*uart, &mut pending);
            }
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
