//! Saving pages of guest RAM as they were at a pause while the guest and the
//! devices go on writing: the memory half of a background snapshot.
//!
//! A [`PageSave`] holds the pages a snapshot layer must contain, each with a
//! slot in the layer's memory file. Until a page is saved nobody may change
//! it:
//! - its host mapping is read-only, so a VMM thread's write (a device filling
//!   a buffer, a virtqueue's used ring) faults, and the fault handler saves
//!   the page before the write goes on;
//! - the hypervisor backend, whose dirty tracking write-protects all of RAM
//!   for the guest at the pause, calls [`GuestRam::before_guest_write`]
//!   before it lets a vCPU write a page (HVF's stage-2 write fault, `emu`'s
//!   TLB fill for a store).
//!
//! The first of the layer's writer thread ([`PageSave::run`]), a faulting
//! VMM thread or a vCPU to reach a page copies it into its slot (`pwrite`),
//! marks it saved and makes it writable again; any other waits for that
//! page alone (the writer marks each page of a batch as soon as its bytes
//! are written). So the file holds every page exactly as it was at the
//! pause, and each write is delayed at most by one page copy. A vCPU's wait
//! ends early if it is kicked ([`GuestRam::before_guest_write_unless_kicked`]),
//! so that a pause or a quit never waits for another thread's I/O.
//!
//! Only pending pages are ever made read-only in the host mapping
//! ([`PageSave::protect`] claims each page while it protects it, and a save
//! waits that out), and every saved page is writable again by the time its
//! saver returns. So the guest never writes a page that is read-only on the
//! host: what the host's protection does to the guest's stage-2 view (on
//! HVF, the framework maps the same pages) never matters.
//!
//! The fault handler (SIGSEGV and SIGBUS, installed on first use, chaining
//! to the previous handler for any fault that is not a pending page of a
//! save) finds saves through a fixed table of RAM ranges, so it allocates
//! nothing and takes no lock: atomics, a binary search, `pwrite` and
//! `mprotect`.

use super::GuestRam;
use crate::arch::layout::PAGE_SIZE;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// Not saved; the host mapping may be read-only.
const PENDING: u8 = 0;
/// Being saved by the thread that claimed it; read-only to everyone.
const SAVING: u8 = 1;
/// In the file. Its host mapping is writable or about to be made so by its
/// saver; anyone who needs it writable sooner makes it so (idempotent).
const SAVED: u8 = 2;
/// Pending, being made read-only by [`PageSave::protect`], which sets it
/// back to [`PENDING`] once the `mprotect` is done; a saver waits for that.
const PROTECTING: u8 = 3;

/// Where each page goes in the layer's memory file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slots {
    /// A RAM image: page `p` at byte `p * PAGE_SIZE`.
    Image,
    /// Packed: the `i`th page of the set at `data_offset + i * PAGE_SIZE`.
    Packed {
        /// File offset of the first page, in bytes.
        data_offset: u64,
    },
}

/// Errors of a [`PageSave`].
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The page list is not strictly increasing or leaves RAM.
    #[error("page {page} is out of order or beyond the {pages} pages of RAM")]
    BadPage {
        /// The offending page index.
        page: u64,
        /// RAM's page count.
        pages: u64,
    },
    /// Every slot of the fault handler's table is taken (one per RAM
    /// mapping that has had a save).
    #[error("too many guest RAM mappings with a background save ({SLOTS} at most)")]
    NoSlot,
    /// Installing the fault handler failed.
    #[error("cannot install the fault handler: {0}")]
    Handler(#[source] std::io::Error),
    /// Writing a page into the memory file failed (the first such error).
    #[error("cannot write a page into the memory file: {0}")]
    Write(#[source] std::io::Error),
}

/// Who saved a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Saver {
    Writer,
    Guest,
    Vmm,
}

/// How many pages each party saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveCounts {
    /// By the writer thread, in order.
    pub writer: u64,
    /// Before a vCPU's first write to them ([`GuestRam::before_guest_write`]).
    pub guest: u64,
    /// By the fault handler, before a VMM thread's write.
    pub vmm: u64,
}

/// The pages of one snapshot layer being saved (see the module docs).
pub struct PageSave {
    /// Host address of RAM's first byte.
    host: usize,
    /// Page indices, strictly increasing.
    pages: Box<[u64]>,
    /// Per page: [`PENDING`], [`SAVING`], [`SAVED`] or [`PROTECTING`].
    state: Box<[AtomicU8]>,
    file: File,
    slots: Slots,
    saved: [AtomicU64; 3],
    /// The first `pwrite`/`mprotect` error (an errno), or 0.
    error: AtomicI32,
    /// Tests: called on the saving thread before each page is written
    /// (with its index in the set), and by [`PageSave::protect`] after each
    /// `mprotect` while its pages are still claimed (with the run's first
    /// index and length).
    #[cfg(test)]
    pub(crate) hooks: TestHooks,
}

/// A writer held inside its write of one page ([`PageSave::hold_writer_at`]).
#[cfg(test)]
pub(crate) struct HeldWriter {
    /// Receives once the writer is inside the write.
    pub(crate) writing: std::sync::mpsc::Receiver<()>,
    /// Lets the writer go on (any number of sends: the first one counts).
    pub(crate) release: std::sync::mpsc::Sender<()>,
}

#[cfg(test)]
impl PageSave {
    /// Holds whoever writes page `i` of the set (its index) inside that
    /// write until [`HeldWriter::release`] is sent to.
    pub(crate) fn hold_writer_at(&self, i: usize) -> HeldWriter {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, writing) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Mutex::new(held);
        let set = self.hooks.before_write.set(Box::new(move |k| {
            if k == i {
                let _ = started.send(());
                let _ = held.lock().unwrap().recv();
            }
        }));
        assert!(set.is_ok(), "one before_write hook per save");
        HeldWriter { writing, release }
    }
}

/// See [`PageSave::hooks`].
#[cfg(test)]
#[derive(Default)]
pub(crate) struct TestHooks {
    pub(crate) before_write: std::sync::OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
    pub(crate) protected: std::sync::OnceLock<Box<dyn Fn(usize, usize) + Send + Sync>>,
    /// Called while a vCPU waits for another thread's save of page `i`
    /// (repeatedly, until the wait ends).
    pub(crate) guest_waits: std::sync::OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
}

impl PageSave {
    /// Starts saving `pages` (indices of 16 KiB pages from the start of RAM,
    /// strictly increasing) of `ram` into `file` at `slots` (the file must
    /// have its final size already: zero pages are left unwritten, holes
    /// that read as zero): registers the save for the fault handler and
    /// [`GuestRam::before_guest_write`]. Call while nothing writes guest RAM
    /// (every vCPU parked, devices quiesced), and make the backend
    /// write-protect RAM for the guest before it runs again. Before the VMM
    /// writes guest RAM again, call [`PageSave::protect`]; then
    /// [`PageSave::run`], holding `ram` until it returns (the save uses its
    /// mapping; dropping the `GuestRam` retires its latest save).
    pub fn start(
        ram: &Arc<GuestRam>,
        pages: Vec<u64>,
        file: File,
        slots: Slots,
    ) -> Result<Arc<PageSave>, SaveError> {
        let total = ram.size() / PAGE_SIZE;
        let mut last = None;
        for &p in &pages {
            if p >= total || last.is_some_and(|l| p <= l) {
                return Err(SaveError::BadPage {
                    page: p,
                    pages: total,
                });
            }
            last = Some(p);
        }
        install_handler()?;
        let slot = ram.save_slot()?;
        let state = pages.iter().map(|_| AtomicU8::new(PENDING)).collect();
        let save = Arc::new(PageSave {
            host: ram.host_ptr() as usize,
            pages: pages.into_boxed_slice(),
            state,
            file,
            slots,
            saved: Default::default(),
            error: AtomicI32::new(0),
            #[cfg(test)]
            hooks: TestHooks::default(),
        });
        // Registered before anything is protected, so that no fault finds a
        // protected page without its save.
        SLOT_TABLE[slot].replace(Some(save.clone()));
        Ok(save)
    }

    /// Makes the pages still pending read-only in the host mapping, so that
    /// a VMM thread's write to one faults and saves it first. Guest writes
    /// are the backend's to catch (they may go on meanwhile). A page is made
    /// read-only only while it is pending and claimed by this call (a save
    /// that reaches it meanwhile waits for the one `mprotect`), so a page a
    /// vCPU saved, or is saving, is never made read-only again, and the
    /// guest never writes a page that is read-only on the host. Call with
    /// no VMM thread writing guest RAM (the devices held); the cost is the
    /// kernel's, per page table entry (about 2 ms for 80 MiB here), which is
    /// why it is not done while the vCPUs are stopped.
    pub fn protect(&self) {
        let mut i = 0;
        while i < self.pages.len() {
            // Claim a run of consecutive pending pages.
            let mut end = i;
            while end < self.pages.len()
                && end - i < PROTECT_RUN
                && (end == i || self.pages[end] == self.pages[end - 1] + 1)
                && self.state[end]
                    .compare_exchange(PENDING, PROTECTING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                end += 1;
            }
            if end == i {
                // Saved or being saved: it stays writable.
                i += 1;
                continue;
            }
            let r = protect(
                self.page_addr(self.pages[i]),
                (end - i) * PAGE_SIZE as usize,
                false,
            );
            #[cfg(test)]
            if let Some(hook) = self.hooks.protected.get() {
                hook(i, end - i);
            }
            for state in &self.state[i..end] {
                state.store(PENDING, Ordering::Release);
            }
            if let Err(e) = r {
                // Each run is a mapping of its own until it is writable
                // again, so very scattered pages can exceed the host's limit
                // (ENOMEM, vm.max_map_count on Linux). Save every page now,
                // while no VMM thread writes RAM, which also undoes the
                // protection.
                tracing::warn!(
                    "cannot write-protect the layer's {} pages ({e}): saving them before the devices run",
                    self.pages.len()
                );
                self.run_unchecked();
                return;
            }
            i = end;
        }
    }

    /// Saves every page not saved yet, in order, and returns who saved how
    /// many; the first write error, if any (every page is writable again
    /// either way). The file is complete when this returns `Ok`.
    pub fn run(&self) -> Result<SaveCounts, SaveError> {
        self.run_unchecked();
        match self.error.load(Ordering::Acquire) {
            0 => Ok(self.counts()),
            errno => Err(SaveError::Write(std::io::Error::from_raw_os_error(errno))),
        }
    }

    /// The writer's pass: claims runs of consecutive pending pages (at
    /// most [`WRITER_RUN`]), writes them, marking each saved as soon as its
    /// bytes are in the file (a thread waiting for one waits for that page
    /// only, and makes it writable itself), then makes the run writable with
    /// one `mprotect`; a page another thread is saving is waited for.
    fn run_unchecked(&self) {
        let mut i = 0;
        while i < self.pages.len() {
            let mut end = i;
            while end < self.pages.len()
                && end - i < WRITER_RUN
                && (end == i || self.pages[end] == self.pages[end - 1] + 1)
                && self.state[end]
                    .compare_exchange(PENDING, SAVING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                end += 1;
            }
            if end == i {
                // Saved, or being saved by a faulting thread: wait for it.
                self.save(i, Saver::Writer, None);
                i += 1;
                continue;
            }
            for j in i..end {
                self.write_page(j);
                self.saved[Saver::Writer as usize].fetch_add(1, Ordering::Relaxed);
                self.state[j].store(SAVED, Ordering::Release);
            }
            let first = self.page_addr(self.pages[i]);
            if let Err(e) = protect(first, (end - i) * PAGE_SIZE as usize, true) {
                self.note_error(e);
            }
            i = end;
        }
    }

    /// Who saved how many pages so far.
    pub fn counts(&self) -> SaveCounts {
        let n = |s: Saver| self.saved[s as usize].load(Ordering::Relaxed);
        SaveCounts {
            writer: n(Saver::Writer),
            guest: n(Saver::Guest),
            vmm: n(Saver::Vmm),
        }
    }

    /// The pages being saved.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    fn page_addr(&self, page: u64) -> usize {
        self.host + (page * PAGE_SIZE) as usize
    }

    /// The index of `page` in the set.
    fn find(&self, page: u64) -> Option<usize> {
        self.pages.binary_search(&page).ok()
    }

    /// Saves page `i` unless it is saved, and makes it writable; if another
    /// thread is saving it (or [`PageSave::protect`] protecting it), waits
    /// for that, unless `kicked` is set meanwhile: then returns `false`,
    /// the page unchanged and perhaps read-only. Async-signal-safe.
    fn save(&self, i: usize, who: Saver, kicked: Option<&dyn Fn() -> bool>) -> bool {
        let state = &self.state[i];
        loop {
            match state.compare_exchange(PENDING, SAVING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(SAVED) => {
                    // Its saver may not have made it writable yet (the
                    // writer unprotects a batch at its end).
                    if let Err(e) = protect(self.page_addr(self.pages[i]), PAGE_SIZE as usize, true)
                    {
                        self.note_error(e);
                    }
                    return true;
                }
                Err(_) => {
                    #[cfg(test)]
                    if let (Saver::Guest, Some(hook)) = (who, self.hooks.guest_waits.get()) {
                        hook(i);
                    }
                    if kicked.is_some_and(|k| k()) {
                        return false;
                    }
                    std::hint::spin_loop();
                }
            }
        }
        self.write_page(i);
        self.saved[who as usize].fetch_add(1, Ordering::Relaxed);
        state.store(SAVED, Ordering::Release);
        if let Err(e) = protect(self.page_addr(self.pages[i]), PAGE_SIZE as usize, true) {
            self.note_error(e);
        }
        true
    }

    /// Writes page `i` (claimed: SAVING) into its slot. Async-signal-safe.
    fn write_page(&self, i: usize) {
        #[cfg(test)]
        if let Some(hook) = self.hooks.before_write.get() {
            hook(i);
        }
        let page = self.pages[i];
        let addr = self.page_addr(page);
        let offset = match self.slots {
            Slots::Image => page * PAGE_SIZE,
            Slots::Packed { data_offset } => data_offset + i as u64 * PAGE_SIZE,
        };
        // The file is created at its full size, so a zero page is a hole
        // that needs no write.
        if !is_zero(addr) {
            if let Err(e) = pwrite_all(self.file.as_raw_fd(), addr, offset) {
                self.note_error(e);
            }
        }
    }

    fn note_error(&self, e: std::io::Error) {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let _ = self
            .error
            .compare_exchange(0, errno, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A write to `page` is about to happen: saves it first if it is
    /// pending (see [`PageSave::save`] for `kicked`). `None` if it is not in
    /// the set, else whether the write may go on.
    fn before_write(
        &self,
        page: u64,
        who: Saver,
        kicked: Option<&dyn Fn() -> bool>,
    ) -> Option<bool> {
        self.find(page).map(|i| self.save(i, who, kicked))
    }
}

/// Whether the page at host address `addr` is all zero. Async-signal-safe.
fn is_zero(addr: usize) -> bool {
    // SAFETY: the page is readable guest RAM of a live mapping, and it
    // cannot change while it is being saved (it is read-only to everyone).
    let words = unsafe { std::slice::from_raw_parts(addr as *const u64, PAGE_SIZE as usize / 8) };
    words.iter().all(|&w| w == 0)
}

/// Most pages the writer claims, writes and unprotects in one go (1 MiB):
/// one `mprotect` per run; a write to one of them waits only until that
/// page is written.
const WRITER_RUN: usize = 64;

/// Most pages [`PageSave::protect`] claims for one `mprotect` (16 MiB): a
/// save of one of them waits for that call.
const PROTECT_RUN: usize = 1024;

/// `mprotect` of `[addr, addr+len)`: read-write or read-only.
/// Async-signal-safe.
fn protect(addr: usize, len: usize, writable: bool) -> std::io::Result<()> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: `[addr, addr+len)` is page-aligned guest RAM of a live
    // mapping (a save is retired before its `GuestRam` unmaps); only its
    // protection changes.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes the page at host address `addr` to `fd` at `offset`.
/// Async-signal-safe.
fn pwrite_all(fd: libc::c_int, addr: usize, offset: u64) -> std::io::Result<()> {
    let mut done = 0usize;
    let len = PAGE_SIZE as usize;
    while done < len {
        let off = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: `addr + done .. addr + len` is readable guest RAM (read-only
        // or read-write, never unmapped while the save lives).
        let n = unsafe { libc::pwrite(fd, (addr + done) as *const libc::c_void, len - done, off) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(std::io::Error::from_raw_os_error(libc::EIO)),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Slots of the fault handler's table.
const SLOTS: usize = 64;
/// A slot's `start` while it is being claimed.
const CLAIMED: usize = usize::MAX;

/// One RAM mapping's entry in the fault handler's table: its host range
/// (claimed on its first save, released when the `GuestRam` drops) and its
/// latest save (kept until the next one replaces it, so that a fault that
/// raced with the end of a save still finds its page saved).
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    save: AtomicPtr<PageSave>,
    /// Fault handlers inside this slot's save.
    inflight: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    save: AtomicPtr::new(std::ptr::null_mut()),
    inflight: AtomicUsize::new(0),
};

static SLOT_TABLE: [Slot; SLOTS] = [EMPTY_SLOT; SLOTS];

/// In a forked child, before it saves anything: the parent's saves are
/// forgotten, not dropped (they hold the parent's files, whose descriptors
/// the child closes); the mappings' claims stay, for the RAM the child
/// maps at the same address.
pub fn forget_saves_in_child() {
    for slot in &SLOT_TABLE {
        slot.save.store(std::ptr::null_mut(), Ordering::SeqCst);
        slot.inflight.store(0, Ordering::SeqCst);
    }
}

impl Slot {
    /// Replaces the slot's save; the old one is dropped once no fault
    /// handler uses it.
    fn replace(&self, save: Option<Arc<PageSave>>) {
        let new = save.map_or(std::ptr::null_mut(), |s| Arc::into_raw(s).cast_mut());
        let old = self.save.swap(new, Ordering::SeqCst);
        while self.inflight.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        if !old.is_null() {
            // SAFETY: `old` came from `Arc::into_raw` in an earlier
            // `replace`, and no handler holds it any more.
            drop(unsafe { Arc::from_raw(old) });
        }
    }

    /// Runs `f` on the slot's save, if it covers host address `addr`.
    /// Async-signal-safe.
    fn with_save<R>(&self, addr: usize, f: impl FnOnce(&PageSave, u64) -> R) -> Option<R> {
        let start = self.start.load(Ordering::SeqCst);
        if start == 0
            || start == CLAIMED
            || addr < start
            || addr - start >= self.len.load(Ordering::SeqCst)
        {
            return None;
        }
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let p = self.save.load(Ordering::SeqCst);
        // SAFETY: a non-null pointer stays valid while `inflight` counts us
        // (`replace` waits for it to drop to zero before freeing).
        let r = (!p.is_null()).then(|| f(unsafe { &*p }, ((addr - start) as u64) / PAGE_SIZE));
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

impl GuestRam {
    /// This mapping's slot in the fault handler's table, claimed on first use.
    fn save_slot(&self) -> Result<usize, SaveError> {
        let start = self.host_ptr() as usize;
        if let Some(i) = SLOT_TABLE
            .iter()
            .position(|s| s.start.load(Ordering::SeqCst) == start)
        {
            return Ok(i);
        }
        for (i, s) in SLOT_TABLE.iter().enumerate() {
            // Claimed with a marker the handler skips, then published.
            if s.start
                .compare_exchange(0, CLAIMED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                s.len.store(self.size() as usize, Ordering::SeqCst);
                s.start.store(start, Ordering::SeqCst);
                self.slot.store(i + 1, Ordering::Release);
                return Ok(i);
            }
        }
        Err(SaveError::NoSlot)
    }

    /// Releases this mapping's slot (its latest save first).
    pub(super) fn release_save_slot(&self) {
        if let Some(i) = self.slot.load(Ordering::Acquire).checked_sub(1) {
            SLOT_TABLE[i].replace(None);
            SLOT_TABLE[i].start.store(0, Ordering::SeqCst);
        }
    }

    /// A vCPU is about to write the 16 KiB page `page` (index from the start
    /// of RAM) for the first time since dirty tracking was re-armed: if a
    /// background snapshot has not saved the page yet, it is saved now (or,
    /// if another thread is saving it, once that page is in the file). The
    /// backends call this before they let the write happen (HVF's stage-2
    /// write fault, `emu`'s TLB fill for a store).
    pub fn before_guest_write(&self, page: u64) {
        self.guest_write(page, None);
    }

    /// [`GuestRam::before_guest_write`] for a vCPU that can be kicked:
    /// `false` if `kicked()` answered true while it waited for another
    /// thread's save of the page, which then is neither saved nor writable:
    /// the caller must not let the write happen, and goes back to its run
    /// loop (the faulting instruction is retried when the vCPU next runs).
    /// `true`: the write may go on. `kicked` is polled while waiting.
    pub fn before_guest_write_unless_kicked(&self, page: u64, kicked: &dyn Fn() -> bool) -> bool {
        self.guest_write(page, Some(kicked))
    }

    fn guest_write(&self, page: u64, kicked: Option<&dyn Fn() -> bool>) -> bool {
        let Some(i) = self.slot.load(Ordering::Acquire).checked_sub(1) else {
            return true;
        };
        let start = self.host_ptr() as usize;
        let addr = start + (page * PAGE_SIZE) as usize;
        SLOT_TABLE[i]
            .with_save(addr, |s, p| s.before_write(p, Saver::Guest, kicked))
            .flatten()
            .unwrap_or(true)
    }
}

/// The handlers the fault handler replaced, to chain to.
static PREVIOUS: [std::sync::OnceLock<libc::sigaction>; 2] =
    [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
/// The signals a write to read-only memory raises (SIGBUS on macOS).
const FAULT_SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

fn install_handler() -> Result<(), SaveError> {
    static INSTALLED: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        for (k, &sig) in FAULT_SIGNALS.iter().enumerate() {
            // SAFETY: a zeroed sigaction is a valid initial value; the
            // handler is async-signal-safe (see `on_fault`).
            unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_fault
                    as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                    as usize;
                new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
                libc::sigemptyset(&mut new.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &new, &mut old) != 0 {
                    return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
                let _ = PREVIOUS[k].set(old);
            }
        }
        Ok(())
    });
    r.map_err(|errno| SaveError::Handler(std::io::Error::from_raw_os_error(errno)))
}

/// The fault address of a SIGSEGV/SIGBUS.
///
/// # Safety
/// `info` is the `siginfo_t` the kernel passed to a fault handler.
unsafe fn fault_address(info: *const libc::siginfo_t) -> usize {
    #[cfg(target_os = "linux")]
    // SAFETY: per the function contract.
    let a = unsafe { (*info).si_addr() } as usize;
    #[cfg(not(target_os = "linux"))]
    // SAFETY: per the function contract.
    let a = unsafe { (*info).si_addr } as usize;
    a
}

/// SIGSEGV/SIGBUS: a write to a page a save has not saved yet saves it and
/// returns, so that the write is retried; anything else goes to the
/// previous handler (or, if there was none, kills the process as before).
extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { fault_address(info) };
    let ours = SLOT_TABLE
        .iter()
        .find_map(|s| s.with_save(addr, |save, page| save.before_write(page, Saver::Vmm, None)))
        .flatten()
        .is_some();
    if ours {
        return;
    }
    let k = FAULT_SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    match PREVIOUS[k].get() {
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO,
                // so it has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler takes the signal number.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // The default action: on return the access faults again and
            // kills the process.
            // SAFETY: resetting a signal's disposition is async-signal-safe.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests;
