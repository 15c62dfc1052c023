//! Forked children: a VM's vCPUs carried across `fork()` into a new VM of
//! the child process ([`crate::hv::Hypervisor::FORKS_VCPUS`]), on RAM
//! mapped anew at the same host address.
//!
//! A branch's source forks once while its vCPUs are parked for the branch's
//! snapshot ([`crate::machine::vcpu::run_state::RunState::fork_parked`]), on
//! the thread that owns them. The child has that thread only; it keeps the
//! vCPUs (on `emu`, unicorn engines with every block the source translated)
//! here, [`inherit`], and builds a VM of its own around them as a restore
//! does, taking them back with [`take_ram`] and [`take_vcpus`] instead of
//! creating vCPUs. Guest RAM is never in a fork (`MADV_DONTFORK`, see
//! [`GuestRam`]: the fork copies none of its page tables, and the source's
//! later writes to it copy nothing); once the
//! layer is in the store, the fork maps the layer's memory where the
//! source's RAM was ([`map_layer_ram`], the address the engines use), which
//! the children it forks inherit. Nothing else of the parent's objects is
//! used in the child: their locks may have been held by threads the child
//! does not have.

use crate::memory::GuestRam;
use crate::sync::Locked;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// A fork for the parked vCPU thread to make: `child` is what the child
/// process does with the parent's vCPUs, which [`inherit`] has put aside for
/// it. It never returns (the child ends with `_exit`; a panic in it ends the
/// child with status 101).
pub struct ForkJob {
    /// The VM's guest RAM: left out of the fork; the child maps the layer's
    /// memory at its address ([`map_layer_ram`]).
    pub ram: Arc<GuestRam>,
    /// The child's work.
    pub child: Box<dyn FnOnce() -> i32 + Send>,
}

/// A fork's outcome, if one was tried: the child's pid, or why there is
/// none.
pub type Forked = Option<Result<i32, String>>;

/// What a forked child inherited: where the parent's RAM was, the layer's
/// memory mapped there, and the vCPUs (with their reset states), typed by
/// the backend.
struct Inherited {
    /// The parent's RAM's host address and size in bytes (its mapping was
    /// not inherited).
    #[cfg(target_os = "linux")]
    parent_ram: (usize, u64),
    /// The layer's memory at that address ([`map_layer_ram`]), until taken.
    #[cfg(target_os = "linux")]
    layer_ram: Option<snapshot_store::FixedMapping>,
    vcpus: Option<Box<dyn Any>>,
}

// SAFETY: the vCPUs are moved between threads of the child only as a whole,
// by whichever thread takes them, and used by one thread at a time (an
// engine is not shared: the parent's thread that owned it does not exist
// in the child).
unsafe impl Send for Inherited {}

/// Locked only in a forked child (set by [`inherit`] on its only thread);
/// the parent never takes it, so no parent thread can hold it at the fork.
static INHERITED: Mutex<Option<Inherited>> = Mutex::new(None);

/// In the child of a [`ForkJob`]'s fork: notes where the parent's `ram` was
/// and puts `vcpus` aside for the VM the child builds.
pub fn inherit<T: 'static>(ram: Arc<GuestRam>, vcpus: Vec<T>) {
    #[cfg(target_os = "linux")]
    let parent_ram = (ram.host_ptr() as usize, ram.size());
    // Forgotten, not dropped: its mapping was not inherited, and dropping
    // it would unmap whatever is mapped there later.
    std::mem::forget(ram);
    *INHERITED.locked() = Some(Inherited {
        #[cfg(target_os = "linux")]
        parent_ram,
        #[cfg(target_os = "linux")]
        layer_ram: None,
        vcpus: Some(Box::new(vcpus)),
    });
}

/// In the child of a [`ForkJob`]'s fork, which has no guest RAM (RAM is
/// never in a fork, [`GuestRam`]): maps the memory of layer `layer` of
/// the store at `store` (its chain, as a restore maps it: the base
/// copy-on-write, the diffs over it) where the parent's RAM was, for the
/// children this process forks to inherit ([`take_ram`]). Nothing is read
/// yet: each child's restore verifies the chain, memory files included,
/// before its guest runs. Errors: the layer cannot be read or mapped there,
/// or its RAM is not the parent's size.
#[cfg(target_os = "linux")]
pub fn map_layer_ram(store: &std::path::Path, layer: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut g = INHERITED.locked();
    let inherited = g
        .as_mut()
        .context("this process inherited no VM from a fork")?;
    anyhow::ensure!(
        inherited.layer_ram.is_none(),
        "the layer's memory is mapped already"
    );
    let (addr, size) = inherited.parent_ram;
    let chain = snapshot_store::Store::open(store)
        .context("cannot open the snapshot store")?
        .resolve(layer)?;
    let ram_size = chain.top().manifest.ram_size;
    anyhow::ensure!(
        ram_size == size,
        "snapshot '{layer}' has {ram_size} bytes of RAM; the VM this process was forked from has {size}"
    );
    let map = snapshot_store::map_chain_memory_at(&chain, addr)
        .with_context(|| format!("cannot map the memory of snapshot '{layer}'"))?;
    inherited.layer_ram = Some(map);
    Ok(())
}

/// [`map_layer_ram`] where forked children are not made (only Linux has
/// them): an error.
#[cfg(not(target_os = "linux"))]
pub fn map_layer_ram(_store: &std::path::Path, _layer: &str) -> anyhow::Result<()> {
    anyhow::bail!("forked children need Linux")
}

/// The layer's memory [`map_layer_ram`] mapped, once, as this VM's guest
/// RAM (`None` in a process that inherited none). Made RAM here, in the
/// child that runs it, so that it is left out of this child's own forks
/// but was in the fork that made the child.
pub fn take_ram() -> Result<Option<Arc<GuestRam>>, crate::memory::MemoryError> {
    #[cfg(target_os = "linux")]
    if let Some(map) = INHERITED.locked().as_mut().and_then(|i| i.layer_ram.take()) {
        return GuestRam::from_fixed(map).map(|r| Some(Arc::new(r)));
    }
    Ok(None)
}

/// The inherited vCPUs, once, if they are `T`s.
pub fn take_vcpus<T: 'static>() -> Option<Vec<T>> {
    let mut g = INHERITED.locked();
    let i = g.as_mut()?;
    let v = i.vcpus.take()?;
    match v.downcast::<Vec<T>>() {
        Ok(v) => Some(*v),
        Err(v) => {
            i.vcpus = Some(v);
            None
        }
    }
}

/// `fork()`, with the locks the child uses of the parent's statics held
/// across it (stderr's, the console's echo, the signal front-end), and in
/// the child the parent's signal front-end, console echo and page saves
/// forgotten. Returns 0 in the child, the child's pid in the parent.
///
/// # Safety
/// As `fork()` in a threaded process: the child must run only on the
/// calling thread, use nothing another thread of the parent may have held
/// locked, and end with `_exit`.
pub unsafe fn fork_process() -> std::io::Result<i32> {
    let stderr = std::io::stderr().lock();
    let mut echo = crate::console::message_echo_slot();
    let mut signals = crate::machine::signals::lock_for_fork();
    // SAFETY: per this function's contract.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        crate::machine::signals::forget_in_child(&mut signals);
        std::mem::forget(echo.take());
        crate::memory::forget_saves_in_child();
    }
    drop((signals, echo, stderr));
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid)
}

/// Runs `job`'s work in the child of a fork (the caller's only thread) with
/// `vcpus` inherited, and ends the process with its status: never returns,
/// never unwinds into the parent's frames below.
pub fn run_child<T: 'static>(job: ForkJob, vcpus: Vec<T>) -> ! {
    inherit(job.ram, vcpus);
    let child = job.child;
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
    // SAFETY: ends this process at once, without the parent's destructors
    // or exit handlers (their objects belong to threads this child lacks).
    unsafe { libc::_exit(code) }
}

/// Names the calling thread (on Linux its `comm`, which `ps`, `pgrep` and
/// `top -H` show; the kernel keeps 15 bytes). A forked process's only
/// thread has the forking thread's name until then. One system call: safe
/// in the child of a threaded process's fork.
pub fn name_thread(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string, 16 bytes at most.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0)
    };
    // SAFETY: names the calling thread from a NUL-terminated string.
    #[cfg(not(target_os = "linux"))]
    unsafe {
        libc::pthread_setname_np(name.as_ptr())
    };
}

/// The kernel's `struct prctl_mm_map` (`linux/prctl.h`), for
/// `PR_SET_MM_MAP`.
#[cfg(target_os = "linux")]
#[repr(C)]
struct PrctlMmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// Makes `argv` this process's command line as `/proc/PID/cmdline` and
/// `ps` show it (a forked child shows its parent's otherwise):
/// `prctl(PR_SET_MM, PR_SET_MM_MAP)` with the process's own memory map
/// (`/proc/self/stat`, proc(5)) but for the arguments, which point at a
/// copy of `argv` kept for the process's life. Needs a kernel with
/// checkpoint/restore (most have it); no privilege.
#[cfg(target_os = "linux")]
pub fn set_cmdline(argv: &[std::ffi::OsString]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| std::io::Error::other("/proc/self/stat has no command name"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // proc(5) numbers fields from 1; the first after the name is field 3.
    let field = |n: usize| -> std::io::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("/proc/self/stat has no field {n}")))
    };
    let mut line = Vec::new();
    for a in argv {
        line.extend_from_slice(a.as_bytes());
        line.push(0);
    }
    let line: &'static [u8] = Box::leak(line.into_boxed_slice());
    // SAFETY: sbrk(0) only reads the program break.
    let brk = unsafe { libc::sbrk(0) } as u64;
    let map = PrctlMmMap {
        start_code: field(26)?,
        end_code: field(27)?,
        start_data: field(45)?,
        end_data: field(46)?,
        start_brk: field(47)?,
        brk,
        start_stack: field(28)?,
        arg_start: line.as_ptr() as u64,
        arg_end: line.as_ptr() as u64 + line.len() as u64,
        env_start: field(50)?,
        env_end: field(51)?,
        auxv: 0,
        auxv_size: 0,
        exe_fd: u32::MAX,
    };
    // SAFETY: PR_SET_MM_MAP reads `map` (its size passed) and changes only
    // what the kernel reports of this process's memory layout; the new
    // arguments' memory lives as long as the process.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_MM,
            libc::PR_SET_MM_MAP as libc::c_ulong,
            &map as *const PrctlMmMap as libc::c_ulong,
            std::mem::size_of::<PrctlMmMap>() as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// For a process that forks while other threads run (a branch's source): an
/// ELF constructor (`.init_array`, before the standard library's runtime
/// starts) that gives SIGSEGV and SIGBUS a handler of ours, which acts as the
/// default one (the process ends with the signal). The standard library
/// installs its stack-overflow handler only where the handler is the
/// default, and with it, at every thread's start and end, takes a
/// process-wide lock of its own: a fork made while another thread held it
/// left it locked in the child, whose first thread start then waited
/// forever. Without it, a thread that overflows its stack ends the process
/// with SIGSEGV and no message. The background snapshot's fault handler
/// chains to this one for faults that are not its own.
#[cfg(target_os = "linux")]
pub extern "C" fn keep_std_fault_handler_out() {
    extern "C" fn as_default(sig: libc::c_int) {
        // SAFETY: resets this signal's disposition and raises it again:
        // async-signal-safe calls only.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: installs a handler that only calls async-signal-safe
        // functions; no other thread exists yet (before main).
        unsafe { libc::signal(sig, as_default as *const () as libc::sighandler_t) };
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn name_thread_names_the_calling_thread_only() {
        std::thread::spawn(|| {
            super::name_thread(c"a-name-of-20-bytes");
            let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
            // The kernel keeps 15 bytes.
            assert_eq!(comm, "a-name-of-20-by\n");
        })
        .join()
        .unwrap();
        let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        assert!(!comm.starts_with("a-name"), "{comm}");
    }
}
