//! The console input thread: host stdin, the escape keys, and the guest UART.

use crate::console::{self, EscapeParser, Key};
use crate::machine::{Shared, VmExit};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// Reads the host's stdin, handles the escape keys, and feeds the guest UART
/// at the pace its RX FIFO drains. `Ctrl-A s` calls `snapshot` after the
/// input typed before it has reached the guest.
pub(in crate::machine) fn spawn(shared: Arc<Shared>, mut snapshot: Box<dyn FnMut() + Send>) {
    let spawned = std::thread::Builder::new()
        .name("console".into())
        .spawn(move || {
            let mut parser = EscapeParser::default();
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 256];
            let mut pending = std::collections::VecDeque::new();
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    match parser.feed(b) {
                        Key::Guest(b) => pending.push_back(b),
                        Key::Quit => {
                            shared.control.finish(VmExit::Quit);
                            return;
                        }
                        Key::Help => console::message(console::ESCAPE_HELP.trim_end()),
                        Key::Snapshot => {
                            feed_uart(&shared, &mut pending);
                            snapshot();
                        }
                        Key::None => {}
                    }
                }
                feed_uart(&shared, &mut pending);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no console input: cannot spawn the console thread: {e}");
    }
}

/// Moves `pending` input into the console UART's RX FIFO as space frees up.
fn feed_uart(shared: &Shared, pending: &mut std::collections::VecDeque<u8>) {
    while !pending.is_empty() && !shared.control.finished() {
        let bytes = pending.make_contiguous();
        let taken = shared.devices.console_input(bytes);
        pending.drain(..taken);
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
