//! Running `boot` without a terminal: `--daemonize` (the process forks;
//! the parent waits until the VM runs, or for the error that stopped it,
//! and exits with 0 or 1), `--pid-file` and `--log-file`.
//!
//! The fork happens before any thread exists (a threaded process cannot
//! fork safely). The daemon leaves the terminal's session (`setsid`), reads
//! nothing (stdin is `/dev/null`), writes its stdout and stderr (the log
//! lines) to the log file or `/dev/null`, and keeps the working directory,
//! so relative paths in the arguments mean what they meant. It tells the
//! parent over a pipe: `R` once the VM runs, or `E` and the error.

use anyhow::Context;
use nix::unistd::{ForkResult, Pid};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::sync::Locked;

/// The daemon's end of the pipe to the parent, which is waiting.
pub struct Daemon {
    pipe: File,
}

impl Daemon {
    /// The VM runs: the parent exits 0.
    pub fn ready(mut self) {
        let _ = self.pipe.write_all(b"R");
    }

    /// The VM could not start: the parent prints `boot: MESSAGE` and exits
    /// 1.
    pub fn failed(mut self, message: &str) {
        let _ = self.pipe.write_all(format!("E{message}").as_bytes());
    }
}

/// Opens `path` for appending (created mode 0600), for logs.
fn open_log(path: &Path) -> anyhow::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("--log-file {}", path.display()))
}

/// `/dev/null`, for reading and writing.
fn open_null() -> anyhow::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .context("/dev/null")
}

/// Makes `fd` this process's file descriptor `to` (`dup2`).
fn dup_onto<F: AsFd + ?Sized>(fd: &F, to: i32) -> anyhow::Result<()> {
    // SAFETY: dup2 on a descriptor we own onto one of the standard ones;
    // it closes `to` and makes it a copy, and touches no memory.
    let r = unsafe { libc::dup2(fd.as_fd().as_raw_fd(), to) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("dup2");
    }
    Ok(())
}

/// Sends this process's stderr to `log` (appended), for `--log-file`
/// without `--daemonize`.
pub fn log_to(log: &Path) -> anyhow::Result<()> {
    dup_onto(&open_log(log)?, 2)
}

/// Forks. The parent never returns: it waits for the daemon's word and
/// exits 0 once the VM runs, or 1 with the error (the daemon's own, or that
/// it ended before the VM ran). The daemon returns its [`Daemon`], with its
/// stdio redirected (stderr and stdout to `log`, appended, else
/// `/dev/null`). Must be called before any thread is started.
pub fn daemonize(log: Option<&Path>) -> anyhow::Result<Daemon> {
    // Opened before the fork, so that a bad path is the parent's error.
    let log = log.map(open_log).transpose()?;
    let null = open_null()?;
    // Not inherited by what the daemon starts (a passt): the parent waits
    // for the pipe's end.
    let (read, write) = crate::pipe::cloexec_pipe().context("pipe")?;
    // SAFETY: no other thread exists yet (the caller's contract), so the
    // child's copy of the process is consistent; it goes on as `boot`.
    match unsafe { nix::unistd::fork() }.context("fork")? {
        ForkResult::Parent { child } => {
            drop(write);
            std::process::exit(wait_for(read, child))
        }
        ForkResult::Child => {
            drop(read);
            detach_stdio(&null, log.as_ref())?;
            Ok(Daemon {
                pipe: File::from(write),
            })
        }
    }
}

/// A daemon's own set-up: a session of its own, stdin `/dev/null`, stdout
/// and stderr `log` (else `/dev/null`).
fn detach_stdio(null: &File, log: Option<&File>) -> anyhow::Result<()> {
    nix::unistd::setsid().context("setsid")?;
    dup_onto(null, 0)?;
    let out: &dyn AsFd = match log {
        Some(f) => f,
        None => null,
    };
    dup_onto(out, 1)?;
    dup_onto(out, 2)
}

/// The parent's wait: the daemon's word on `read`, and the exit status it
/// means.
fn wait_for(read: OwnedFd, child: Pid) -> i32 {
    let mut word = Vec::new();
    let _ = File::from(read).read_to_end(&mut word);
    match word.split_first() {
        Some((b'R', _)) => 0,
        Some((b'E', msg)) => {
            eprintln!("boot: {}", String::from_utf8_lossy(msg));
            1
        }
        _ => {
            use nix::sys::wait::{waitpid, WaitStatus};
            let how = match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, code)) => format!("exit status {code}"),
                Ok(WaitStatus::Signaled(_, sig, _)) => format!("killed by {sig}"),
                _ => "an unknown end".to_string(),
            };
            eprintln!("boot: the daemon ended before the VM ran ({how}); see its --log-file");
            1
        }
    }
}

/// How `boot` runs without a terminal, set up before any thread: a daemon
/// (`--daemonize`) or not, its log file and its pid file.
pub struct Detach {
    daemon: Arc<Mutex<Option<Daemon>>>,
    pid: Mutex<Option<PidFile>>,
}

impl Detach {
    /// Forks a daemon if `daemonize` ([`daemonize`]: the parent does not
    /// return), else sends stderr to `log` if given ([`log_to`]); then
    /// writes the pid file (a daemon's failure to is its parent's error).
    pub fn start(daemonize: bool, log: Option<&Path>, pid: Option<&Path>) -> anyhow::Result<Self> {
        let daemon = if daemonize {
            Some(self::daemonize(log)?)
        } else {
            log.map_or(Ok(()), log_to)?;
            None
        };
        let detach = Detach {
            daemon: Arc::new(Mutex::new(daemon)),
            pid: Mutex::new(None),
        };
        detach.pid_file(pid)?;
        Ok(detach)
    }

    /// A daemon made by a fork someone else did (a branch's forked child,
    /// [`crate::machine::branch`]): the daemon's set-up as [`daemonize`]'s
    /// child does it, its word going to `pipe`, whose reader waits as
    /// [`daemonize`]'s parent does; then the pid file. Must be called
    /// before any thread is started.
    pub fn forked(pipe: OwnedFd, log: Option<&Path>, pid: Option<&Path>) -> anyhow::Result<Self> {
        let daemon = Daemon {
            pipe: File::from(pipe),
        };
        let set_up = || -> anyhow::Result<()> {
            let log = log.map(open_log).transpose()?;
            detach_stdio(&open_null()?, log.as_ref())
        };
        if let Err(e) = set_up() {
            daemon.failed(&format!("{e:#}"));
            return Err(e);
        }
        let detach = Detach {
            daemon: Arc::new(Mutex::new(Some(daemon))),
            pid: Mutex::new(None),
        };
        detach.pid_file(pid)?;
        Ok(detach)
    }

    /// Writes the pid file, if any; failing to is the start's error.
    fn pid_file(&self, pid: Option<&Path>) -> anyhow::Result<()> {
        match pid.map(PidFile::create).transpose() {
            Ok(pid) => {
                *self.pid.locked() = pid;
                Ok(())
            }
            Err(e) => {
                self.failed(&format!("{e:#}"));
                Err(e)
            }
        }
    }

    /// What to call once the VM runs: a daemon's parent exits 0.
    pub fn on_running(&self) -> Box<dyn FnOnce()> {
        let d = self.daemon.clone();
        Box::new(move || {
            if let Some(d) = d.locked().take() {
                d.ready();
            }
        })
    }

    /// The VM could not start (or stopped before it ran): the pid file is
    /// removed, then a daemon's parent prints `boot: MESSAGE` and exits 1
    /// (so that nothing of the daemon is left when it does).
    pub fn failed(&self, message: &str) {
        drop(self.pid.locked().take());
        if let Some(d) = self.daemon.locked().take() {
            d.failed(message);
        }
    }
}

/// `--pid-file`: this process's pid, written when made, removed when
/// dropped (if it still holds this pid).
pub struct PidFile {
    path: PathBuf,
    pid: u32,
}

impl PidFile {
    /// Writes `PID\n` to `path` (replacing a file there: a new file renamed
    /// over it, so a reader never sees it half written).
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let tmp = path.with_file_name(format!(
            ".{}.tmp-{pid}",
            path.file_name()
                .map_or("pid".into(), |n| n.to_string_lossy())
        ));
        std::fs::write(&tmp, format!("{pid}\n"))
            .and_then(|()| std::fs::rename(&tmp, path))
            .with_context(|| format!("--pid-file {}", path.display()))?;
        Ok(PidFile {
            path: path.to_path_buf(),
            pid,
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours =
            std::fs::read_to_string(&self.path).is_ok_and(|s| s.trim() == self.pid.to_string());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_holds_the_pid_and_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("boot.pid");
        std::fs::write(&p, "stale\n").unwrap();
        let f = PidFile::create(&p).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{}\n", std::process::id())
        );
        drop(f);
        assert!(!p.exists());
        // Another process's file is left alone.
        let f = PidFile::create(&p).unwrap();
        std::fs::write(&p, "1\n").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "1\n");
        assert!(PidFile::create(&dir.path().join("no/such/dir/p")).is_err());
    }
}
