//! The host end of the guest's console (`boot --console`): this process's
//! stdio (the terminal in raw mode), a file the output is appended to, or
//! a socket console ([`crate::machine::console_socket`]).

use crate::console::{self, RawTerminal};
use crate::machine::config::ConsoleConfig;
use crate::machine::console_input::{self, Uart};
use crate::machine::console_socket::ConsoleSocket;
use crate::machine::ops::Verbs;
use anyhow::Context;
use std::fs::File;
use std::io::Write;
use std::sync::Arc;

/// The console's host end, opened before the VM is built.
pub enum HostConsole {
    /// stdout for the output, stdin for the input.
    Stdio,
    /// The output appended to a file; no input.
    File(File),
    /// A socket console.
    Socket(ConsoleSocket),
}

impl HostConsole {
    /// Opens the console `c`: the file (appended to, created mode 0600) or
    /// the socket (listening; a live one or another file at its path
    /// refused). Errors name the option.
    pub fn open(c: &ConsoleConfig) -> anyhow::Result<Self> {
        Ok(match c {
            ConsoleConfig::Stdio => HostConsole::Stdio,
            ConsoleConfig::File(path) => {
                use std::os::unix::fs::OpenOptionsExt;
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOCTTY)
                    .open(path)
                    .with_context(|| format!("--console file:{}", path.display()))?;
                HostConsole::File(f)
            }
            ConsoleConfig::Socket(path) => HostConsole::Socket(ConsoleSocket::listen(path)?),
        })
    }

    /// Where the guest's UART writes.
    pub fn output(&self) -> anyhow::Result<Box<dyn Write + Send>> {
        Ok(match self {
            HostConsole::Stdio => Box::new(std::io::stdout()),
            HostConsole::File(f) => Box::new(f.try_clone().context("--console file")?),
            HostConsole::Socket(s) => Box::new(s.output()),
        })
    }

    /// A terminal on stdin in raw mode until dropped (stdio only).
    pub fn raw_terminal(&self) -> anyhow::Result<Option<RawTerminal>> {
        match self {
            HostConsole::Stdio => RawTerminal::enter()
                .map(Some)
                .context("cannot put the terminal into raw mode"),
            _ => Ok(None),
        }
    }

    /// Starts the input (stdin's thread, or the socket's clients), which
    /// feeds `uart` and turns the escapes into `verbs`; a socket console
    /// also gets the VMM's messages.
    pub fn start(&mut self, verbs: Arc<dyn Verbs>, uart: Arc<dyn Uart>) -> anyhow::Result<()> {
        match self {
            HostConsole::Stdio => console_input::spawn(verbs, uart),
            HostConsole::File(_) => {}
            HostConsole::Socket(s) => {
                console::set_message_echo(Some(s.echo()));
                s.serve(verbs, uart)?;
            }
        }
        Ok(())
    }

    /// The VM has ended: a socket console's client gets the last output
    /// and is closed; the file is flushed.
    pub fn finish(&self) {
        match self {
            HostConsole::Stdio => {
                let _ = std::io::stdout().flush();
            }
            HostConsole::File(f) => {
                let _ = f.sync_data();
            }
            HostConsole::Socket(s) => {
                console::set_message_echo(None);
                s.finish();
            }
        }
    }
}
