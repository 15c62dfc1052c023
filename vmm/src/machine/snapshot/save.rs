//! Writing a snapshot layer of a running VM: the VMM's verbs (stop,
//! capture, restart) called in order, and the layer written to the store.
//!
//! Both modes start alike: the VM stops ([`Vmm::stop`]: vCPUs park and
//! capture their own state, and the guest's clock stops: one count for the
//! VM, saved once); the devices are prepared (virtio requests complete
//! inside the MMIO write that queued them, so none is in flight once every
//! vCPU is parked); the machine state is captured and encoded and the
//! disk's copy begun: for a diff, the chunks written since the parent
//! (`disk.diff`); for a full layer, a clone where the file system has one,
//! otherwise a copy; what is copied is copied while the guest runs, the
//! block device copying any chunk it is about to write first.
//!
//! - `stop`: the memory is written, and the layer committed (temporary
//!   directory, fsync, rename), while the vCPUs stay parked; only then are
//!   the dirty bitmaps cleared and write protection re-armed.
//! - `background`: the layer's pages (those written since the parent, or
//!   for a full layer since the VM started; all of RAM without tracking)
//!   are registered with a [`PageSave`] (the backend's write protection
//!   catches the guest's writes to them), dirty tracking is re-armed for
//!   the next layer, and the vCPUs resume; the devices that write guest RAM
//!   stay held until the pages are read-only in the VMM's mapping too. A
//!   writer thread ([`super::writer`]) then saves the pages (any page the
//!   guest or a device is about to change is saved first), hashes and
//!   commits the layer. If that fails, nothing is committed and the layer's
//!   pages and disk chunks are carried into the next snapshot, so no dirty
//!   page is lost.
//!
//! Either way the clock goes on from where it stopped when the vCPUs
//! resume, so the guest sees no time pass during the pause.

use super::state::{MachineState, MACHINE_STATE_VERSION};
use super::writer::{self, BackgroundWriter, Begun, Lineage, Opened, Outcome};
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::console;
use crate::hv::Vm;
use crate::machine::config::{SnapshotMode, SnapshotOptions};
use crate::machine::fork::{ForkJob, Forked};
use crate::machine::ops::{PauseError, SnapshotError, Written};
use crate::machine::vm::{Stopped, Vmm};
use crate::machine::VmExit;
use crate::memory::{PageSave, Slots};
use crate::sync::Locked;
use anyhow::Context;
use snapshot_store::{Layer, LayerMeta, Store, DISK_CHUNK_SIZE};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Test hook: with `IGNITION_TEST_SNAPSHOT_DELAY_MS=N` in its environment,
/// `boot` keeps the VM paused N ms longer at every snapshot taken with
/// `--snapshot-mode stop` (after the layer is written), so that end-to-end
/// tests can check that guest time stands still across a pause without
/// depending on how fast this machine writes a layer
/// (`scripts/tests/test_clock_e2e.py`).
pub const TEST_DELAY_ENV: &str = "IGNITION_TEST_SNAPSHOT_DELAY_MS";

/// Test hook: with `IGNITION_TEST_SNAPSHOT_GATE=PATH` in its environment,
/// a background layer's writer waits, with the guest running, until `PATH`
/// exists (and removes it) before it saves any page, so that tests can
/// make the guest and the devices write pages that are still to be saved,
/// or make the write fail, whatever this machine's speed
/// (`scripts/tests/test_background_snapshot_e2e.py`).
pub const TEST_GATE_ENV: &str = "IGNITION_TEST_SNAPSHOT_GATE";

/// Test hook: with `IGNITION_TEST_SNAPSHOT_PAUSE_GATE=PATH` in its
/// environment, a snapshot that has opened its layer waits, with the guest
/// running, until `PATH` exists (and removes it) before it stops the VM, so
/// that tests can make a quit land in that window
/// (`scripts/tests/test_control_socket.py`).
pub const TEST_PAUSE_GATE_ENV: &str = "IGNITION_TEST_SNAPSHOT_PAUSE_GATE";

/// The console line of a front-end's quit that waits for a snapshot to stop
/// the VM ([`Snapshots::quit`]).
pub const QUIT_WAITS: &str = "[snapshot] quitting once the snapshot being taken has stopped the VM";

/// The console line of a VM that has ended while a snapshot is being taken
/// or written: `boot` exits once the layer is committed or cleanly failed.
pub const WAIT_AT_EXIT: &str =
    "[snapshot] the VM has ended; finishing the snapshot being written before exiting";

/// The snapshots of one running VM: where they go, what the next one
/// builds on, and the background layer being written.
pub struct Snapshots {
    store: PathBuf,
    /// `boot --name`: the first layer's name (then NAME.2, NAME.3, ...).
    name: Option<String>,
    mode: SnapshotMode,
    backend: &'static str,
    lineage: Arc<Mutex<Lineage>>,
    /// One snapshot at a time (held for the whole verb).
    taking: Mutex<()>,
    /// Held by a snapshot from its start until the VM is stopped, and by
    /// a front-end's quit while it ends the VM ([`Snapshots::quit`]): a
    /// quit never lands between a snapshot's start and its pause.
    stopping: Mutex<()>,
    /// The background layer being written, if any.
    writer: Mutex<Option<BackgroundWriter>>,
    /// Threads recording layers' verified-file caches; joined at the end.
    cache_writers: writer::CacheWriters,
    /// The test hook's delay ([`TEST_DELAY_ENV`]).
    test_delay: Option<Duration>,
    /// The test hook's gate ([`TEST_GATE_ENV`]).
    test_gate: Option<PathBuf>,
    /// The test hook's pause gate ([`TEST_PAUSE_GATE_ENV`]).
    test_pause_gate: Option<PathBuf>,
    /// Whether the guest agent has answered (in this VM, or before the
    /// snapshot it was restored from), which each layer records.
    agent_answered: Box<dyn Fn() -> bool + Send + Sync>,
}

impl Snapshots {
    /// The snapshots of a VM with options `opts`, written by `backend`;
    /// `parent` is the layer a restored VM came from (the first diff's
    /// parent, with tracking); each layer records what `agent_answered`
    /// says then (whether the guest agent has answered).
    pub fn new(
        opts: &SnapshotOptions,
        parent: Option<Layer>,
        backend: &'static str,
        agent_answered: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        Snapshots {
            store: opts.store.clone(),
            name: opts.name.clone(),
            mode: opts.mode,
            backend,
            lineage: Arc::new(Mutex::new(Lineage {
                taken: 0,
                track_dirty: opts.track_dirty,
                parent: if opts.track_dirty { parent } else { None },
                carry_pages: Vec::new(),
                carry_chunks: Vec::new(),
            })),
            taking: Mutex::new(()),
            stopping: Mutex::new(()),
            writer: Mutex::new(None),
            cache_writers: Arc::new(Mutex::new(Vec::new())),
            test_delay: std::env::var(TEST_DELAY_ENV)
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
            test_gate: std::env::var_os(TEST_GATE_ENV).map(PathBuf::from),
            test_pause_gate: std::env::var_os(TEST_PAUSE_GATE_ENV).map(PathBuf::from),
            agent_answered,
        }
    }

    /// Writes snapshot `name` (default: the next of `--name`'s NAME,
    /// NAME.2, ...) of `vmm`, saying on the console how it goes, and returns
    /// the layer once it is in the store (`wait`), or once its background
    /// writer has started (`!wait`: `None`; the console has the outcome).
    /// A background layer still being written is finished first. A VM the
    /// pause verb holds stays paused, and its held state is used.
    pub fn take<V: Vm>(
        &self,
        vmm: &Vmm<V>,
        name: Option<String>,
        wait: bool,
    ) -> Result<Option<Written>, SnapshotError> {
        self.take_forking(vmm, name, wait, None).0
    }

    /// [`Snapshots::take`], and, if `fork` is given and the layer's start
    /// succeeded, a fork made while the vCPUs are still stopped (RAM is the
    /// layer's, [`Vmm::fork_stopped`]): its outcome, the child's pid or why
    /// not, comes second (`None`: no fork was tried).
    pub fn take_forking<V: Vm>(
        &self,
        vmm: &Vmm<V>,
        name: Option<String>,
        wait: bool,
        fork: Option<ForkJob>,
    ) -> (Result<Option<Written>, SnapshotError>, Forked) {
        // Before `taking`, so that `writing()` is never true while a quit
        // may still end the VM ahead of this snapshot's pause.
        let stopping = self.stopping.locked();
        let _one = self.taking.locked();
        // The previous layer's outcome was on the console already.
        let _ = self.finish_background(true);
        let Some(name) = name.or_else(|| self.next_name()) else {
            let e = SnapshotError::NoName;
            console::message(&format!("[snapshot] refused: {e}"));
            return (Err(e), None);
        };
        let opened = match self.open_layer(vmm, &name) {
            Ok(o) => o,
            Err(reason) => {
                let e = SnapshotError::Failed { name, reason };
                console::message(&format!("[snapshot] {e}"));
                return (Err(e), None);
            }
        };
        if let Some(gate) = &self.test_pause_gate {
            writer::pass_gate(gate);
        }
        let t = Instant::now();
        let stopped = vmm.stop();
        drop(stopping);
        let stopped = match stopped {
            Ok(s) => s,
            Err(e) => {
                let e = match e {
                    PauseError::ShuttingDown => SnapshotError::ShuttingDown { name },
                    e => SnapshotError::Failed {
                        name,
                        reason: e.into(),
                    },
                };
                console::message(&format!("[snapshot] {e}"));
                return (Err(e), None);
            }
        };
        let was_paused = stopped.was_paused;
        let mut to_protect = None;
        let result = match self.mode {
            SnapshotMode::Stop => {
                let r = self.write(vmm, opened, &name, &stopped);
                if let Some(d) = self.test_delay {
                    std::thread::sleep(d);
                }
                r.map(Some)
            }
            SnapshotMode::Background => {
                self.start_background(vmm, opened, &name, &stopped)
                    .map(|save| {
                        to_protect = Some(save);
                        None
                    })
            }
        };
        // Held from before the resume until the layer's pages are
        // protected in the VMM's mapping: protecting costs the kernel per
        // page table entry, too long to do with the vCPUs stopped, and
        // until it is done no device may write guest RAM (a vCPU that
        // reaches one waits).
        let devices = vmm.devices();
        let held = to_protect.as_ref().map(|_| devices.hold_ram_writers());
        let forked = match fork {
            Some(job) if result.is_ok() => {
                let t = Instant::now();
                Some((vmm.fork_stopped(&stopped, job), t.elapsed()))
            }
            _ => None,
        };
        vmm.restart(stopped);
        // Said once the guest runs again: the console may be slow.
        let forked = forked.map(|(r, took)| {
            console::message(&format!("Branch-fork-time = {} us", took.as_micros()));
            r
        });
        let pause_us = if was_paused {
            0
        } else {
            let us = t.elapsed().as_micros() as u64;
            console::message(&format!("Snapshot-pause-time = {us} us"));
            us
        };
        if let Some(save) = to_protect {
            let t = Instant::now();
            save.protect();
            drop(held);
            console::message(&format!(
                "Snapshot-device-hold-time = {} us",
                t.elapsed().as_micros()
            ));
        }
        // Frames that arrived during the snapshot go to the guest.
        devices.after_save();
        let written = match result {
            Ok(Some((lines, mut written))) => {
                lines.iter().for_each(|l| console::message(l));
                written.pause_us = pause_us;
                Ok(Some(written))
            }
            Ok(None) => {
                if let Some(w) = self.writer.locked().as_mut() {
                    // The writer starts once the guest runs, not competing
                    // with the resume for this host's CPUs.
                    w.start(pause_us);
                }
                if !wait {
                    return (Ok(None), forked);
                }
                match self.finish_background(false) {
                    Some(r) => r.map(Some),
                    None => Err(SnapshotError::Failed {
                        name,
                        reason: anyhow::anyhow!("the snapshot writer is gone"),
                    }),
                }
            }
            Err(reason) => {
                let e = SnapshotError::Failed { name, reason };
                console::message(&format!("[snapshot] {e}"));
                Err(e)
            }
        };
        (written, forked)
    }

    /// The name of the next snapshot: `NAME`, then `NAME.2`, `NAME.3`, ...
    pub fn next_name(&self) -> Option<String> {
        let base = self.name.as_ref()?;
        Some(match self.lineage.locked().taken {
            0 => base.clone(),
            n => format!("{base}.{}", n + 1),
        })
    }

    /// The layer the next snapshot is a diff against.
    pub fn parent_name(&self) -> Option<String> {
        self.lineage
            .locked()
            .parent
            .as_ref()
            .map(|l| l.name.clone())
    }

    /// Pages a diff written now would hold (0 without dirty tracking).
    pub fn dirty_pages_pending<V: Vm>(&self, vmm: &Vmm<V>) -> usize {
        if !self.lineage.locked().track_dirty {
            return 0;
        }
        self.dirty_pages(vmm).map_or(0, |p| p.len())
    }

    /// Whether a snapshot is being taken, or a background layer written.
    pub fn writing(&self) -> bool {
        self.taking.try_lock().is_err() || self.writer.locked().as_ref().is_some_and(|w| w.busy())
    }

    /// Ends `vmm` for a front-end (`Ctrl-A x`, the control socket's `quit`,
    /// a signal): waits first for a snapshot that has started to stop the
    /// VM, which is then written before `boot` exits ([`Snapshots::finish`]).
    /// It does not wait for the write.
    /// Says [`QUIT_WAITS`] on the console when it waits.
    pub fn quit<V: Vm>(&self, vmm: &Vmm<V>) {
        let _stopping = match self.stopping.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                console::message(QUIT_WAITS);
                self.stopping.locked()
            }
        };
        vmm.finish(VmExit::Quit);
    }

    /// Waits until layer `name`'s verified-file cache is recorded (a thread
    /// does it after the commit, once the files' timestamps are older than
    /// the store's racy window, at most about 50 ms): a restore of the layer
    /// started after this finds its files vouched for instead of hashing
    /// them. Returns at once if no such thread is pending.
    pub fn wait_cache_record(&self, name: &str) {
        let mine: Vec<JoinHandle<()>> = {
            let mut all = self.cache_writers.locked();
            let (mine, rest) = std::mem::take(&mut *all)
                .into_iter()
                .partition(|(n, _)| n == name);
            *all = rest;
            mine.into_iter().map(|(_, h)| h).collect()
        };
        for h in mine {
            let _ = h.join();
        }
    }

    /// Waits for the background layer being written, if any (`say`: tells
    /// the console when that takes a while), and returns how it went.
    fn finish_background(&self, say: bool) -> Option<Result<Written, SnapshotError>> {
        let w = self.writer.locked().take()?;
        Some(w.finish(say))
    }

    /// At the VM's end: waits for a snapshot being taken (its layer is
    /// committed or cleanly failed), a background layer being written, and
    /// the verified-file caches being recorded. Says so on the console
    /// ([`WAIT_AT_EXIT`]) if a snapshot is under way.
    pub fn finish(&self) {
        if self.writing() {
            console::message(WAIT_AT_EXIT);
        }
        let _one = self.taking.locked();
        let _ = self.finish_background(false);
        let writers = std::mem::take(&mut *self.cache_writers.locked());
        for (_, w) in writers {
            let _ = w.join();
        }
    }

    /// Opens layer `name`'s writer before the VM stops: the store checks
    /// the name and the parent (the lineage's, which cannot change until
    /// this snapshot is done: `taking` is held) and makes its work directory
    /// and memory file, and a background layer's writer thread.
    fn open_layer<V: Vm>(&self, vmm: &Vmm<V>, name: &str) -> anyhow::Result<Opened> {
        let store = Store::create(&self.store).context("cannot open the snapshot store")?;
        let lineage = self.lineage.locked();
        let meta = LayerMeta {
            parent: lineage.parent.as_ref().map(Layer::parent_ref),
            page_size: PAGE_SIZE,
            ram_base_gpa: RAM_BASE,
            ram_size: vmm.ram().size(),
            vcpus: u32::try_from(vmm.vcpus()).expect("at most MAX_VCPUS"),
            backend: self.backend.to_string(),
            gic_mode: vmm.irqchip().mode().name().to_string(),
            creator: creator(),
        };
        drop(lineage);
        let diff = meta.parent.is_some();
        let mut w = store.begin(name, meta)?;
        w.create_memory_file()?;
        let idle = match self.mode {
            SnapshotMode::Background => Some(writer::IdleWriter::spawn()?),
            SnapshotMode::Stop => None,
        };
        Ok(Opened { w, diff, idle })
    }

    /// Begins layer `name` (its writer `opened`) of the stopped VM: captures
    /// the machine state and the disk.
    fn begin<V: Vm>(
        &self,
        vmm: &Vmm<V>,
        opened: Opened,
        name: &str,
        stopped: &Stopped<'_>,
    ) -> anyhow::Result<Begun> {
        let ram = vmm.ram();
        let devices = vmm.devices();
        devices.prepare_save()?;
        let captured = vmm
            .capture(stopped)
            .context("cannot save the GIC's state")?;
        let state = MachineState {
            version: MACHINE_STATE_VERSION,
            backend: self.backend.to_string(),
            ram_size: ram.size(),
            cmdline: vmm.cmdline().to_string(),
            vcpus: stopped.vcpus.clone(),
            power: captured.power,
            clock: captured.clock,
            gic: captured.gic,
            agent_answered: Some((self.agent_answered)()),
            devices: captured.devices,
        };
        let Opened { mut w, diff, .. } = opened;
        let lineage = self.lineage.locked();
        // A diff's disk is a disk diff where the parent's disk has the
        // shape of this VM's (always, unless the parent came from another
        // writer).
        let src = vmm.disk().clone();
        let diff_disk = lineage.parent.as_ref().is_some_and(|p| {
            p.manifest
                .disk
                .as_ref()
                .is_some_and(|d| d.size == src.size() && d.chunk_size == DISK_CHUNK_SIZE)
        });
        // The disk first, so that its changed chunks are hashed while memory
        // is written. An image unchanged since the parent is the parent's.
        let mut chunks = devices.root_disk().device().written_chunks();
        chunks.extend(&lineage.carry_chunks);
        chunks.sort_unstable();
        chunks.dedup();
        drop(lineage);
        let mut blk = devices.root_disk();
        // The previous layer's copy, if any, is complete or abandoned.
        blk.device_mut().set_before_write(None);
        // The parent's disk is immutable: an empty diff of it can wait.
        let disk_begun = !(diff && chunks.is_empty());
        if disk_begun {
            // What is not cloned is copied while the VM runs: the block
            // device copies a chunk before writing to it.
            let copy = if diff && diff_disk {
                Some(w.begin_disk_diff(src, &chunks)?)
            } else {
                w.begin_disk_from(src, diff.then_some(&chunks[..]))?
            };
            if let Some(copy) = copy {
                blk.device_mut().set_before_write(Some(Arc::new(copy)));
            }
        }
        drop(blk);
        Ok(Begun {
            name: name.to_string(),
            w,
            state: state.encode(),
            diff,
            disk_begun,
            chunks,
        })
    }

    /// The pages written by the guest or the VMM since the parent (or, for
    /// a full layer, since the VM started), and those of a failed
    /// background layer: what a layer written with tracking holds.
    fn dirty_pages<V: Vm>(&self, vmm: &Vmm<V>) -> anyhow::Result<Vec<u64>> {
        let mut pages = vmm.hv_vm().dirty_pages()?;
        pages.extend(vmm.ram().vmm_dirty_pages());
        pages.extend(&self.lineage.locked().carry_pages);
        pages.sort_unstable();
        pages.dedup();
        Ok(pages)
    }

    /// Writes the layer while every vCPU is parked; returns the console
    /// lines and the layer.
    fn write<V: Vm>(
        &self,
        vmm: &Vmm<V>,
        opened: Opened,
        name: &str,
        stopped: &Stopped<'_>,
    ) -> anyhow::Result<(Vec<String>, Written)> {
        let t = Instant::now();
        let mut b = self.begin(vmm, opened, name, stopped)?;
        let ram = vmm.ram();
        // SAFETY: every vCPU is parked (`stopped`) and the devices are
        // prepared, so nothing writes guest RAM while `bytes` is alive.
        let bytes = unsafe { ram.bytes() };
        let pages = if b.diff {
            let pages = self.dirty_pages(vmm)?;
            b.w.write_diff_from_ram(bytes, pages.iter().copied())?
        } else {
            b.w.write_full_memory(bytes)?;
            ram.size() / PAGE_SIZE
        };
        b.w.write_state(&b.state)?;
        let clone = writer::finish_disk(&mut b.w, b.disk_begun)?;
        let (layer, cache) = b.w.commit_cache_later()?;
        self.cache_writers.locked().push((b.name.clone(), cache));
        // The layer is durable: only now forget what was dirty.
        self.restart_tracking(vmm, Some(layer));
        let took = t.elapsed();
        Ok((
            writer::report(&b.name, b.diff, pages, took, &clone),
            writer::record(&b.name, b.diff, pages, took),
        ))
    }

    /// Clears what was dirty (the disk's written chunks, a failed layer's
    /// carry) and re-arms dirty tracking for the next layer; `written` is
    /// the layer just committed (`None` while a background layer is still
    /// being written). If re-arming fails, what is dirty is no longer known:
    /// later snapshots of this run are full layers.
    fn restart_tracking<V: Vm>(&self, vmm: &Vmm<V>, written: Option<Layer>) {
        vmm.devices()
            .root_disk()
            .device_mut()
            .clear_written_chunks();
        let mut l = self.lineage.locked();
        l.carry_pages.clear();
        l.carry_chunks.clear();
        if written.is_some() {
            l.taken += 1;
        }
        if !l.track_dirty {
            return;
        }
        match vmm.hv_vm().rearm_dirty_tracking() {
            Ok(()) => {
                vmm.ram().vmm_dirty().clear_all();
                if written.is_some() {
                    l.parent = written;
                }
            }
            Err(e) => {
                l.track_dirty = false;
                l.parent = None;
                console::message(&format!(
                    "[snapshot] dirty tracking could not be re-armed ({e}); later snapshots are full"
                ));
            }
        }
    }

    /// Begins a background layer while every vCPU is parked: captures the
    /// state and the disk, write-protects the layer's pages, re-arms dirty
    /// tracking for the next layer, and starts the thread that writes the
    /// pages once the guest runs again.
    /// Returns the page save, whose pages the caller must write-protect
    /// ([`PageSave::protect`]) before any device writes guest RAM again.
    fn start_background<V: Vm>(
        &self,
        vmm: &Vmm<V>,
        mut opened: Opened,
        name: &str,
        stopped: &Stopped<'_>,
    ) -> anyhow::Result<Arc<PageSave>> {
        let idle = match opened.idle.take() {
            Some(t) => t,
            None => writer::IdleWriter::spawn()?,
        };
        let mut b = self.begin(vmm, opened, name, stopped)?;
        let ram = vmm.ram();
        // Tracked since the VM started, the pages written so far are a
        // diff's, or a full layer's (every other page is still zero, a hole
        // in the layer): see `Snapshots::start_tracking`.
        let tracked = self.lineage.locked().track_dirty;
        let pages: Vec<u64> = if tracked {
            self.dirty_pages(vmm)?
        } else {
            (0..ram.size() / PAGE_SIZE).collect()
        };
        let memory = b.w.memory_file(b.diff.then_some(&pages[..]))?;
        let slots = match memory.data_offset {
            Some(data_offset) => Slots::Packed { data_offset },
            None => Slots::Image,
        };
        let file = memory
            .file
            .try_clone()
            .context("cannot share the memory file with the page saver")?;
        let save = PageSave::start(ram, pages, file, slots)
            .context("cannot start saving the layer's pages")?;
        // The layer's pages are captured: what the guest writes from now on
        // belongs to the next layer. Without re-armed protection, guest
        // writes would not wait for their page to be saved, so the pages
        // are written now, before the guest runs.
        self.restart_tracking(vmm, None);
        let carry_pages = tracked.then(|| save.pages().to_vec());
        if !tracked || !self.lineage.locked().track_dirty {
            save.run().context("cannot write the layer's pages")?;
        }
        let carry_chunks = b.chunks.clone();
        let thread = idle.start(
            b,
            memory,
            save.clone(),
            Outcome {
                lineage: self.lineage.clone(),
                cache_writers: self.cache_writers.clone(),
                carry_pages,
                carry_chunks,
            },
            self.test_gate.clone(),
        );
        *self.writer.locked() = Some(thread);
        Ok(save)
    }

    /// Starts tracking guest-RAM writes (`--track-dirty`) on `vmm`. What the
    /// VMM wrote into RAM before (a fresh VM's kernel, device tree and
    /// initrd, loaded into RAM that was zero; a restored VM's new generation
    /// ID) stays marked: a fresh VM's first (full) layer then holds exactly
    /// the pages ever written, and a restored VM's first diff holds what
    /// changed since its layer.
    pub fn start_tracking<V: Vm>(&self, vmm: &Vmm<V>) -> anyhow::Result<()> {
        if !self.lineage.locked().track_dirty {
            return Ok(());
        }
        vmm.hv_vm()
            .rearm_dirty_tracking()
            .context("cannot start dirty tracking")
    }
}

/// `ignition-vmm <version>`, recorded in manifests.
fn creator() -> String {
    format!("ignition-vmm {}", env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn waiting_for_a_layers_cache_record_joins_its_writer_only() {
        let opts = SnapshotOptions {
            store: PathBuf::from("/nonexistent"),
            name: None,
            track_dirty: true,
            mode: SnapshotMode::Background,
        };
        let s = Snapshots::new(&opts, None, "emu", Box::new(|| false));
        let done = Arc::new(AtomicBool::new(false));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let d = done.clone();
        let a = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            d.store(true, Ordering::SeqCst);
        });
        // Another layer's writer, still running: not waited for.
        let b = std::thread::spawn(move || {
            let _ = held.recv();
        });
        s.cache_writers.locked().push(("a".into(), a));
        s.cache_writers.locked().push(("b".into(), b));
        s.wait_cache_record("a");
        assert!(done.load(Ordering::SeqCst));
        s.wait_cache_record("absent");
        let left: Vec<String> = s
            .cache_writers
            .locked()
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        assert_eq!(left, ["b"]);
        drop(release);
        s.finish();
        assert!(s.cache_writers.locked().is_empty());
    }
}
