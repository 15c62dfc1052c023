//! The VMM's own pipes, close-on-exec: what the process starts (a passt,
//! a branch's started child) inherits none of them unless it is meant to.

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use std::os::fd::{AsFd, OwnedFd};

/// A pipe (read end, write end), both ends close-on-exec.
pub fn cloexec_pipe() -> nix::Result<(OwnedFd, OwnedFd)> {
    // pipe2(O_CLOEXEC) is not on macOS: the flag is set after, as the
    // standard library does there.
    let (read, write) = nix::unistd::pipe()?;
    set_cloexec(&read)?;
    set_cloexec(&write)?;
    Ok((read, write))
}

/// Marks `fd` close-on-exec.
pub fn set_cloexec<F: AsFd>(fd: &F) -> nix::Result<()> {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_close_on_exec() {
        let (read, write) = cloexec_pipe().unwrap();
        for end in [&read, &write] {
            let flags = FdFlag::from_bits_truncate(fcntl(end, FcntlArg::F_GETFD).unwrap());
            assert!(flags.contains(FdFlag::FD_CLOEXEC));
        }
    }
}
