//! The host console: raw terminal mode, the Ctrl-A escape keys, and the VMM's
//! messages on it.
//!
//! Escapes (after `Ctrl-A`): `x` quits, `s` writes a snapshot, `h` or `?`
//! lists the escapes, `a` or a second `Ctrl-A` sends a literal `Ctrl-A`, `d`
//! detaches from a socket console (`boot --console socket:PATH`); any other
//! key is dropped.

use crate::sync::Locked;
use nix::sys::termios::{self, SetArg, Termios};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;

/// The escape prefix, `Ctrl-A`.
pub const ESCAPE: u8 = 0x01;

/// Help text for `Ctrl-A h`, one escape per line.
pub const ESCAPE_HELP: &str = "Ctrl-A x  quit\r\nCtrl-A s  write a snapshot\r\nCtrl-A h  show this help\r\nCtrl-A a  send Ctrl-A to the guest\r\nCtrl-A d  detach (a socket console)\r\n";

/// What one input byte means after escape processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Send this byte to the guest.
    Guest(u8),
    /// Quit the VMM (`Ctrl-A x`).
    Quit,
    /// Write a snapshot (`Ctrl-A s`).
    Snapshot,
    /// Show the escape help (`Ctrl-A h`).
    Help,
    /// Detach from a socket console (`Ctrl-A d`); nothing on a terminal.
    Detach,
    /// Nothing (the escape prefix itself, or an unknown escape).
    None,
}

/// The escape-key state machine.
#[derive(Debug, Default)]
pub struct EscapeParser {
    pending: bool,
}

impl EscapeParser {
    /// Interprets one input byte.
    pub fn feed(&mut self, byte: u8) -> Key {
        if !self.pending {
            if byte == ESCAPE {
                self.pending = true;
                return Key::None;
            }
            return Key::Guest(byte);
        }
        self.pending = false;
        match byte {
            b'x' | b'X' => Key::Quit,
            b's' | b'S' => Key::Snapshot,
            b'h' | b'H' | b'?' => Key::Help,
            b'd' | b'D' => Key::Detach,
            b'a' | b'A' | ESCAPE => Key::Guest(ESCAPE),
            _ => Key::None,
        }
    }
}

/// The terminal settings to restore, shared with the panic hook and the
/// signal front-end's immediate exit.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Puts stdin's terminal (if it is one) into raw mode until dropped. Also
/// installs a panic hook that restores the terminal first; the signals
/// that end `boot` wind the VM down and drop this (or, a second time,
/// restore the terminal before the process ends), so no exit path leaves
/// it raw.
pub struct RawTerminal {
    active: bool,
}

impl RawTerminal {
    /// Enters raw mode if stdin is a terminal; otherwise does nothing.
    pub fn enter() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let fd = stdin.as_fd();
        let Ok(saved) = termios::tcgetattr(fd) else {
            return Ok(RawTerminal { active: false });
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        // Keep output post-processing so host log lines stay readable.
        raw.output_flags = saved.output_flags;
        *SAVED.locked() = Some(saved);
        install_restore_paths();
        termios::tcsetattr(fd, SetArg::TCSANOW, &raw).map_err(std::io::Error::from)?;
        Ok(RawTerminal { active: true })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if self.active {
            restore_terminal();
        }
    }
}

/// Restores the saved terminal settings, if any.
pub fn restore_terminal() {
    let saved = match SAVED.try_lock() {
        Ok(mut g) => g.take(),
        Err(_) => None,
    };
    if let Some(t) = saved {
        // SAFETY: fd 0 stays open for the life of the process.
        let fd = unsafe { BorrowedFd::borrow_raw(0) };
        let _ = termios::tcsetattr(fd, SetArg::TCSANOW, &t);
    }
}

fn install_restore_paths() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        previous(info);
    }));
}

/// Where VMM messages go besides stderr: a socket console's output
/// ([`set_message_echo`]); called with each message's bytes.
pub type MessageEcho = std::sync::Arc<dyn Fn(&[u8]) + Send + Sync>;

static ECHO: Mutex<Option<MessageEcho>> = Mutex::new(None);

/// Sends every later [`message`] to `echo` too (a socket console, whose
/// user sees them as a terminal's does); `None` stops it.
pub fn set_message_echo(echo: Option<MessageEcho>) {
    *ECHO.locked() = echo;
}

/// Where [`message`] echoes to, locked: for a fork, which holds it across
/// ([`crate::machine::fork`]), so that the child's copy is not locked by a
/// thread the child lacks.
pub(crate) fn message_echo_slot() -> std::sync::MutexGuard<'static, Option<MessageEcho>> {
    ECHO.locked()
}

/// Writes a VMM message to the console (stderr, and a socket console's
/// output if there is one), on its own line.
pub fn message(msg: &str) {
    // One write: the guest's console output (stdout, the same terminal)
    // cannot land inside the line.
    let line = format!("\r\n{msg}\r\n");
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    let _ = err.flush();
    drop(err);
    let echo = ECHO.locked().clone();
    if let Some(echo) = echo {
        echo(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b'l'), Key::Guest(b'l'));
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(b'x'), Key::Quit);
        assert_eq!(p.feed(b'x'), Key::Guest(b'x'));
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(b'a'), Key::Guest(ESCAPE));
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(ESCAPE), Key::Guest(ESCAPE));
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(b's'), Key::Snapshot);
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(b'h'), Key::Help);
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(b'q'), Key::None);
        assert_eq!(p.feed(b'q'), Key::Guest(b'q'));
        assert_eq!(p.feed(ESCAPE), Key::None);
        assert_eq!(p.feed(b'd'), Key::Detach);
        assert_eq!(p.feed(b'd'), Key::Guest(b'd'));
    }
}
