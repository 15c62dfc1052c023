//! The signal front-end: `SIGTERM`, `SIGINT` and `SIGHUP` end the VM as
//! `Ctrl-A x` does, with the [`Op::Quit`] verb. The wind-down that follows
//! is every ending's: a snapshot being taken or written is committed or
//! cleanly failed, the control socket's requests are answered, the host
//! files (the control socket, the vsock socket, a restored VM's working
//! directory) are removed, and `boot` exits with status 0.
//!
//! A second signal, while the VM winds down (or before it runs), ends the
//! process at once with status 128 + the signal's number: the terminal is
//! restored and nothing else is done (a layer being written is not
//! committed; `vmstore gc` removes what it leaves in the store).
//!
//! The handler does no work: it writes the signal's number to a pipe
//! (`write` is async-signal-safe), and a thread reads the pipe and asks for
//! the verb. A signal that arrives before the VM runs (during a restore's
//! verification, say) is kept and served as soon as it does.

use crate::console;
use crate::machine::ops::{Op, Verbs};
use crate::sync::Locked;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::io::Read;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

/// The signals that end the VM.
pub const QUIT_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// The pipe's write end, for the handler (-1 until installed).
static PIPE: AtomicI32 = AtomicI32::new(-1);

/// Where the signal thread sends the verb.
enum Stage {
    /// The VM does not run yet: a signal waits here.
    Starting { pending: Option<Signal> },
    /// The VM runs: signals go to its verbs.
    Running(Arc<dyn Verbs>),
}

/// What the handler and the signal thread share with [`Signals::serve`].
struct Shared {
    stage: Mutex<Stage>,
    /// Signals received so far.
    received: Mutex<u32>,
}

/// The signal front-end, installed once per process ([`install`]).
#[derive(Clone)]
pub struct Signals {
    shared: Arc<Shared>,
}

extern "C" fn on_signal(sig: libc::c_int) {
    // errno is put back, so that the interrupted code sees its own.
    let errno = nix::errno::Errno::last_raw();
    let fd = PIPE.load(Ordering::Relaxed);
    let byte = sig as u8;
    // SAFETY: write(2) is async-signal-safe; `byte` lives across the call.
    // The pipe is non-blocking: a full pipe drops the byte, and the thread
    // has work enough queued already.
    unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    nix::errno::Errno::set_raw(errno);
}

/// The process's front-end, once [`install`]ed.
static INSTALLED: Mutex<Option<Signals>> = Mutex::new(None);

/// For a fork ([`crate::machine::fork`]): the front-end's slot, locked, so
/// that the child's copy is not held by a thread the child lacks. In the
/// child, pass it to [`forget_in_child`].
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, Option<Signals>> {
    INSTALLED.locked()
}

/// In a forked child, with the slot [`lock_for_fork`] locked: the parent's
/// front-end is forgotten (its thread is not in the child, and its pipe's
/// descriptor will be another file's), the handlers are the default ones
/// until the child's own [`install`].
pub(crate) fn forget_in_child(slot: &mut Option<Signals>) {
    std::mem::forget(slot.take());
    PIPE.store(-1, Ordering::Relaxed);
    for sig in QUIT_SIGNALS {
        // SAFETY: restores the default disposition; no handler of ours runs.
        let _ = unsafe {
            sigaction(
                sig,
                &SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty()),
            )
        };
    }
}

/// Installs the handlers of [`QUIT_SIGNALS`] and starts the thread that
/// serves them (once per process: later calls return the same front-end).
/// Until [`Signals::serve`] is called, a signal waits.
pub fn install() -> anyhow::Result<Signals> {
    let mut installed = INSTALLED.locked();
    if let Some(s) = &*installed {
        return Ok(s.clone());
    }
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) = crate::pipe::cloexec_pipe()?;
    fcntl(&write, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    PIPE.store(write.into_raw_fd(), Ordering::Relaxed);
    let shared = Arc::new(Shared {
        stage: Mutex::new(Stage::Starting { pending: None }),
        received: Mutex::new(0),
    });
    let s = shared.clone();
    let mut read = std::fs::File::from(read);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut b = [0u8; 1];
            while read.read_exact(&mut b).is_ok() {
                if let Ok(sig) = Signal::try_from(libc::c_int::from(b[0])) {
                    s.received(sig);
                }
            }
        })?;
    // SA_RESTART: the other threads' system calls (the console's read of
    // stdin, say) go on rather than fail with EINTR.
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in QUIT_SIGNALS {
        // SAFETY: `on_signal` only calls async-signal-safe functions
        // (write, and errno's thread-local accessors).
        unsafe { sigaction(sig, &action) }?;
    }
    let signals = Signals { shared };
    *installed = Some(signals.clone());
    Ok(signals)
}

impl Shared {
    /// Signal `sig` was received: the first one quits (or waits for the VM
    /// to run), a later one ends the process at once.
    fn received(&self, sig: Signal) {
        let n = {
            let mut n = self.received.locked();
            *n += 1;
            *n
        };
        if n > 1 {
            console::restore_terminal();
            console::message(&format!("[boot] {sig} again: ending at once"));
            // SAFETY: _exit ends the process without running anything
            // more, which is what a second signal asks for.
            unsafe { libc::_exit(128 + sig as libc::c_int) };
        }
        console::message(&format!(
            "[boot] {sig}: quitting (another signal ends boot at once)"
        ));
        let verbs = match &mut *self.stage.locked() {
            Stage::Starting { pending } => {
                *pending = Some(sig);
                return;
            }
            Stage::Running(v) => v.clone(),
        };
        let _ = verbs.execute(Op::Quit);
    }
}

impl Signals {
    /// Sends the signals to `verbs` from now on, and a signal that came
    /// before it at once.
    pub fn serve(&self, verbs: Arc<dyn Verbs>) {
        let pending = {
            let mut stage = self.shared.stage.locked();
            let pending = match &*stage {
                Stage::Starting { pending } => *pending,
                Stage::Running(_) => None,
            };
            *stage = Stage::Running(verbs.clone());
            pending
        };
        if pending.is_some() {
            let _ = verbs.execute(Op::Quit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::ops::{OpError, Reply};

    /// Verbs that record what they were asked.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<Op>>);

    impl Verbs for Recorded {
        fn execute(&self, op: Op) -> Result<Reply, OpError> {
            self.0.locked().push(op);
            Ok(Reply::Done {})
        }
    }

    fn front_end() -> Signals {
        Signals {
            shared: Arc::new(Shared {
                stage: Mutex::new(Stage::Starting { pending: None }),
                received: Mutex::new(0),
            }),
        }
    }

    #[test]
    fn a_signal_quits_the_running_vm() {
        let s = front_end();
        let verbs = Arc::new(Recorded::default());
        s.serve(verbs.clone());
        assert!(verbs.0.locked().is_empty());
        s.shared.received(Signal::SIGTERM);
        assert_eq!(*verbs.0.locked(), [Op::Quit]);
    }

    #[test]
    fn a_signal_before_the_vm_runs_waits_for_it() {
        let s = front_end();
        s.shared.received(Signal::SIGHUP);
        let verbs = Arc::new(Recorded::default());
        s.serve(verbs.clone());
        assert_eq!(*verbs.0.locked(), [Op::Quit]);
    }
}
