//! Ctrl-A s: stopping every vCPU at an instruction boundary, capturing the
//! machine, and writing a layer to the snapshot store.
//!
//! Both modes start alike: vCPUs park and capture their own state, and the
//! guest's clock stops (one count for the VM, saved once); devices are idle
//! (virtio requests complete inside the MMIO write that queued them, so none
//! is in flight once every vCPU is parked); the machine state is encoded
//! and the disk's copy begun: a clone where the file system has one,
//! otherwise a copy made while the guest runs, the block device copying any
//! chunk it is about to write first.
//!
//! - `stop`: the memory is written, and the layer committed (temporary
//!   directory, fsync, rename), while the vCPUs stay parked; only then are
//!   the dirty bitmaps cleared and write protection re-armed.
//! - `background`: the layer's pages (those written since the parent, or
//!   for a full layer since the VM started; all of RAM without tracking)
//!   are registered with a [`PageSave`] (the backend's write protection
//!   catches the guest's writes to them), dirty tracking is re-armed for the
//!   next layer, and the vCPUs resume; the devices that write guest RAM
//!   stay held until the pages are read-only in the VMM's mapping too. A
//!   writer thread then saves the pages (any page the guest or a device is
//!   about to change is saved first), hashes and commits the layer. If that fails, nothing is
//!   committed and the layer's pages and disk chunks are carried into the
//!   next snapshot, so no dirty page is lost.
//!
//! Either way the clock goes on from where it stopped when the vCPUs
//! resume, so the guest sees no time pass during the pause.

use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::console;
use crate::devices::Persist;
use crate::hv::Vm;
use crate::machine::config::SnapshotMode;
use crate::machine::snapshot::state::{MachineState, VcpuState, MACHINE_STATE_VERSION};
use crate::machine::Shared;
use crate::memory::{PageSave, Slots};
use crate::sync::Locked;
use anyhow::Context;
use snapshot_store::{DiskClone, Layer, LayerMeta, SnapshotWriter, Store};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Test hook: with `IGNITION_TEST_SNAPSHOT_DELAY_MS=N` in its environment,
/// `boot` keeps the VM paused N ms longer at every snapshot taken with
/// `--snapshot-mode stop` (after the layer is written), so that end-to-end
/// tests can check that guest time stands still across a pause without
/// depending on how fast this machine writes a layer
/// (`scripts/tests/test_clock_e2e.py`).
pub(in crate::machine) const TEST_DELAY_ENV: &str = "IGNITION_TEST_SNAPSHOT_DELAY_MS";

/// Test hook: with `IGNITION_TEST_SNAPSHOT_GATE=PATH` in its environment,
/// a background layer's writer waits, with the guest running, until `PATH`
/// exists (and removes it) before it saves any page, so that tests can
/// make the guest and the devices write pages that are still to be saved,
/// or make the write fail, whatever this machine's speed
/// (`scripts/tests/test_background_snapshot_e2e.py`).
pub(in crate::machine) const TEST_GATE_ENV: &str = "IGNITION_TEST_SNAPSHOT_GATE";

/// What the next layer builds on; updated by a background layer's writer
/// when it finishes.
struct Lineage {
    /// Snapshots written in this run.
    taken: u32,
    /// Dirty tracking is armed (it stops if re-arming fails).
    track_dirty: bool,
    /// The layer the next snapshot is a diff against, when tracking.
    parent: Option<Layer>,
    /// Pages and disk chunks of a background layer that failed: dirtied
    /// since `parent`, so the next layer holds them.
    carry_pages: Vec<u64>,
    carry_chunks: Vec<u64>,
}

/// Takes snapshots for one running VM.
pub(in crate::machine) struct Snapshotter<V: Vm> {
    vm: Arc<V>,
    shared: Arc<Shared>,
    store: PathBuf,
    name: Option<String>,
    mode: SnapshotMode,
    lineage: Arc<Mutex<Lineage>>,
    disk: PathBuf,
    cmdline: String,
    backend: &'static str,
    /// The test hook's delay ([`TEST_DELAY_ENV`]).
    test_delay: Option<Duration>,
    /// The test hook's gate ([`TEST_GATE_ENV`]).
    test_gate: Option<PathBuf>,
    /// The vCPUs' parked states while the VM is paused by
    /// [`Snapshotter::pause`].
    held: Option<Vec<VcpuState>>,
}

/// A layer written, as the control socket reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(in crate::machine) struct Written {
    /// The layer's name.
    pub(in crate::machine) name: String,
    /// `full` or `diff`.
    pub(in crate::machine) kind: &'static str,
    /// 16 KiB pages of memory it holds.
    pub(in crate::machine) pages: u64,
    /// vCPUs stopped to running again, in us (0 if the VM was paused
    /// already).
    pub(in crate::machine) pause_us: u64,
    /// `Snapshot-write-time`, in ms.
    pub(in crate::machine) write_ms: u64,
}

/// A layer begun while the VM is paused: its writer with the disk done,
/// and what the memory must hold.
struct Begun {
    name: String,
    w: SnapshotWriter,
    state: Vec<u8>,
    diff: bool,
    /// The disk's copy is begun (`false`: the layer reuses the parent's
    /// image); [`finish_disk`] completes either.
    disk_begun: bool,
    /// The disk chunks written since the parent (for a diff).
    chunks: Vec<u64>,
}

impl<V: Vm> Snapshotter<V> {
    pub(in crate::machine) fn new(
        vm: Arc<V>,
        shared: Arc<Shared>,
        opts: &crate::machine::SnapshotOptions,
        parent: Option<Layer>,
        disk: PathBuf,
        cmdline: String,
        backend: &'static str,
    ) -> Self {
        Snapshotter {
            vm,
            shared,
            store: opts.store.clone(),
            name: opts.name.clone(),
            mode: opts.mode,
            lineage: Arc::new(Mutex::new(Lineage {
                taken: 0,
                track_dirty: opts.track_dirty,
                parent: if opts.track_dirty { parent } else { None },
                carry_pages: Vec::new(),
                carry_chunks: Vec::new(),
            })),
            disk,
            cmdline,
            backend,
            test_delay: std::env::var(TEST_DELAY_ENV)
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
            test_gate: std::env::var_os(TEST_GATE_ENV).map(PathBuf::from),
            held: None,
        }
    }

    /// The name of the next snapshot: `NAME`, then `NAME.2`, `NAME.3`, ...
    fn next_name(&self) -> Option<String> {
        let base = self.name.as_ref()?;
        Some(match self.lineage.locked().taken {
            0 => base.clone(),
            n => format!("{base}.{}", n + 1),
        })
    }

    /// Handles Ctrl-A s: writes a snapshot, or says on the console why not.
    /// A background layer still being written is finished first.
    pub(in crate::machine) fn take(&mut self) {
        // The console has the outcome (and the control socket is not asking).
        let _ = self.snapshot(None);
    }

    /// Writes snapshot `name` (default: the next of `--name`'s NAME,
    /// NAME.2, ...), saying on the console how it goes. Returns the layer if
    /// it is written when this returns (`--snapshot-mode stop`), `None` if
    /// its background writer is still at work ([`finish_background`]
    /// returns the outcome). If the VM is paused ([`Snapshotter::pause`]),
    /// it stays paused and its parked state is used.
    pub(in crate::machine) fn snapshot(
        &mut self,
        name: Option<String>,
    ) -> Result<Option<Written>, String> {
        // The previous layer's outcome was on the console already.
        let _ = finish_background(&self.shared, true);
        let Some(name) = name.or_else(|| self.next_name()) else {
            let msg = "no snapshot name (start boot with --name NAME)";
            console::message(&format!("[snapshot] refused: {msg}"));
            return Err(msg.into());
        };
        let shared = self.shared.clone();
        let (control, clock) = (&shared.control, &shared.clock);
        let t = Instant::now();
        let states = match &self.held {
            Some(states) => states.clone(),
            None => match control.pause(clock) {
                Ok(s) => s,
                Err(e) => {
                    control.resume(clock);
                    let msg = format!("'{name}' failed: {e:#}");
                    console::message(&format!("[snapshot] {msg}"));
                    return Err(msg);
                }
            },
        };
        let mut to_protect = None;
        let result = match self.mode {
            SnapshotMode::Stop => {
                let r = self.write(&name, states);
                if let Some(d) = self.test_delay {
                    std::thread::sleep(d);
                }
                r.map(Some)
            }
            SnapshotMode::Background => self.start_background(&name, states).map(|save| {
                to_protect = Some(save);
                None
            }),
        };
        // Held from before the resume until the layer's pages are
        // protected in the VMM's mapping: protecting costs the kernel
        // per page table entry, too long to do with the vCPUs stopped, and
        // until it is done no device may write guest RAM (a vCPU that
        // reaches one waits).
        let devices = to_protect
            .as_ref()
            .map(|_| shared.devices.hold_ram_writers());
        let pause_us = if self.held.is_some() {
            0
        } else {
            control.resume(clock);
            let us = t.elapsed().as_micros() as u64;
            console::message(&format!("Snapshot-pause-time = {us} us"));
            us
        };
        if let Some(save) = to_protect {
            let t = Instant::now();
            save.protect();
            drop(devices);
            console::message(&format!(
                "Snapshot-device-hold-time = {} us",
                t.elapsed().as_micros()
            ));
        }
        // Frames that arrived during the snapshot go to the guest.
        shared.devices.release();
        match result {
            Ok(Some((lines, mut written))) => {
                lines.iter().for_each(|l| console::message(l));
                written.pause_us = pause_us;
                Ok(Some(written))
            }
            Ok(None) => {
                if let Some(w) = self.shared.snapshot_writer.locked().as_mut() {
                    w.pause_us = pause_us;
                    // The writer starts once the guest runs, not competing
                    // with the resume for this host's CPUs.
                    w.go = None;
                }
                Ok(None)
            }
            Err(e) => {
                let msg = format!("'{name}' failed, nothing was written: {e:#}");
                console::message(&format!("[snapshot] {msg}"));
                Err(msg)
            }
        }
    }

    /// Pauses the VM (every vCPU parked, the guest's clock stopped) until
    /// [`Snapshotter::resume`]. Refused if it is paused already.
    pub(in crate::machine) fn pause(&mut self) -> Result<(), String> {
        if self.held.is_some() {
            return Err("the VM is paused already".into());
        }
        let (control, clock) = (&self.shared.control, &self.shared.clock);
        match control.pause(clock) {
            Ok(states) => {
                self.held = Some(states);
                Ok(())
            }
            Err(e) => {
                control.resume(clock);
                Err(format!("{e:#}"))
            }
        }
    }

    /// Resumes a VM paused by [`Snapshotter::pause`].
    pub(in crate::machine) fn resume(&mut self) -> Result<(), String> {
        if self.held.take().is_none() {
            return Err("the VM is not paused".into());
        }
        self.shared.control.resume(&self.shared.clock);
        Ok(())
    }

    /// Whether the VM is paused by [`Snapshotter::pause`].
    pub(in crate::machine) fn paused(&self) -> bool {
        self.held.is_some()
    }

    /// The layer the next snapshot is a diff against, if any.
    pub(in crate::machine) fn parent_name(&self) -> Option<String> {
        self.lineage
            .locked()
            .parent
            .as_ref()
            .map(|l| l.name.clone())
    }

    /// Pages a diff written now would hold (0 without dirty tracking).
    pub(in crate::machine) fn dirty_pages_pending(&self) -> usize {
        if !self.lineage.locked().track_dirty {
            return 0;
        }
        self.dirty_pages().map_or(0, |p| p.len())
    }

    /// Begins layer `name` while every vCPU is parked: captures the machine
    /// state and the disk, and opens the writer.
    fn begin(&self, name: &str, vcpus: Vec<VcpuState>) -> anyhow::Result<Begun> {
        let shared = &self.shared;
        let ram = &shared.ram;
        shared.devices.quiesce()?;
        let power = shared.control.lock().power.clone();
        let state = MachineState {
            version: MACHINE_STATE_VERSION,
            backend: self.backend.to_string(),
            ram_size: ram.size(),
            cmdline: self.cmdline.clone(),
            vcpus,
            power,
            clock: shared.clock.save(),
            gic: shared
                .irqchip
                .save()
                .context("cannot save the GIC's state")?,
            devices: shared.devices.save(),
        };
        let store = Store::create(&self.store)
            .with_context(|| format!("cannot open the snapshot store {}", self.store.display()))?;
        let lineage = self.lineage.locked();
        let meta = LayerMeta {
            parent: lineage.parent.as_ref().map(Layer::parent_ref),
            page_size: PAGE_SIZE,
            ram_base_gpa: RAM_BASE,
            ram_size: ram.size(),
            vcpus: u32::try_from(state.vcpus.len()).expect("at most MAX_VCPUS"),
            backend: self.backend.to_string(),
            gic_mode: shared.irqchip.mode().name().to_string(),
            creator: creator(),
        };
        let diff = meta.parent.is_some();
        let mut w = store.begin(name, meta)?;
        // The disk first, so that its changed chunks are hashed while memory
        // is written. An image unchanged since the parent is the parent's.
        let mut chunks = shared.devices.root_disk().device().written_chunks();
        chunks.extend(&lineage.carry_chunks);
        chunks.sort_unstable();
        chunks.dedup();
        drop(lineage);
        let mut blk = shared.devices.root_disk();
        // The previous layer's copy, if any, is complete or abandoned.
        blk.device_mut().set_before_write(None);
        // The parent's image is immutable: cloning it can wait.
        let disk_begun = !(diff && chunks.is_empty());
        if disk_begun {
            // A restored VM's working disk may still be being copied.
            blk.device_mut()
                .wait_ready()
                .context("the VM's disk image is not usable")?;
            // Where the image cannot be cloned, it is copied while the VM
            // runs: the block device copies a chunk before writing to it.
            if let Some(copy) = w.begin_disk(&self.disk, diff.then_some(&chunks[..]))? {
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
    fn dirty_pages(&self) -> anyhow::Result<Vec<u64>> {
        let mut pages = self.vm.dirty_pages()?;
        pages.extend(self.shared.ram.vmm_dirty_pages());
        pages.extend(&self.lineage.locked().carry_pages);
        pages.sort_unstable();
        pages.dedup();
        Ok(pages)
    }

    /// Writes the layer while every vCPU is parked; returns the console
    /// lines and the layer.
    fn write(
        &mut self,
        name: &str,
        vcpus: Vec<VcpuState>,
    ) -> anyhow::Result<(Vec<String>, Written)> {
        let t = Instant::now();
        let mut b = self.begin(name, vcpus)?;
        let ram = &self.shared.ram;
        // SAFETY: every vCPU is parked (`pause` returned) and the block device
        // is quiesced, so nothing writes guest RAM while `bytes` is alive.
        let bytes = unsafe { ram.bytes() };
        let pages = if b.diff {
            let pages = self.dirty_pages()?;
            b.w.write_diff_from_ram(bytes, pages.iter().copied())?
        } else {
            b.w.write_full_memory(bytes)?;
            ram.size() / PAGE_SIZE
        };
        b.w.write_state(&b.state)?;
        let clone = finish_disk(&mut b.w, b.disk_begun)?;
        let (layer, cache) = b.w.commit_cache_later()?;
        self.shared.cache_writers.locked().push(cache);
        // The layer is durable: only now forget what was dirty.
        self.restart_tracking(Some(layer));
        let took = t.elapsed();
        Ok((
            report(&b.name, b.diff, pages, took, &clone),
            written_layer(&b.name, b.diff, pages, took),
        ))
    }

    /// Clears what was dirty (the disk's written chunks, a failed layer's
    /// carry) and re-arms dirty tracking for the next layer; `written` is
    /// the layer just committed (`None` while a background layer is still
    /// being written). If re-arming fails, what is dirty is no longer known:
    /// later snapshots of this run are full layers.
    fn restart_tracking(&self, written: Option<Layer>) {
        let shared = &self.shared;
        shared
            .devices
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
        match self.vm.rearm_dirty_tracking() {
            Ok(()) => {
                shared.ram.vmm_dirty().reset();
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
    fn start_background(
        &mut self,
        name: &str,
        vcpus: Vec<VcpuState>,
    ) -> anyhow::Result<Arc<PageSave>> {
        let mut b = self.begin(name, vcpus)?;
        let ram = self.shared.ram.clone();
        // Tracked since the VM started, the pages written so far are a
        // diff's, or a full layer's (every other page is still zero, a hole
        // in the layer): see `build::start_dirty_tracking`.
        let tracked = self.lineage.locked().track_dirty;
        let pages: Vec<u64> = if tracked {
            self.dirty_pages()?
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
        let save = PageSave::start(&ram, pages, file, slots)
            .context("cannot start saving the layer's pages")?;
        let to_protect = save.clone();
        // The layer's pages are captured: what the guest writes from now on
        // belongs to the next layer. Without re-armed protection, guest
        // writes would not wait for their page to be saved, so the pages
        // are written now, before the guest runs.
        self.restart_tracking(None);
        let mut carry = (tracked.then(|| save.pages().to_vec()), b.chunks.clone());
        if !tracked || !self.lineage.locked().track_dirty {
            save.run().context("cannot write the layer's pages")?;
        }
        let lineage = self.lineage.clone();
        let shared = self.shared.clone();
        let gate = self.test_gate.clone();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("snapshot-writer".into())
            .spawn(move || {
                // Released (the sender dropped) once the vCPUs run again
                // and the layer's pages are protected (`Snapshotter::snapshot`).
                let _ = wait.recv();
                let t = Instant::now();
                if let Some(gate) = gate {
                    while std::fs::remove_file(&gate).is_err() {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                let Begun {
                    name,
                    mut w,
                    state,
                    diff,
                    disk_begun,
                    ..
                } = b;
                let written = save
                    .run()
                    .context("cannot write the layer's pages")
                    .and_then(|counts| {
                        w.finish_memory_file(memory)?;
                        w.write_state(&state)?;
                        let clone = finish_disk(&mut w, disk_begun)?;
                        Ok((w.commit_cache_later()?, counts, clone))
                    });
                let mut l = lineage.locked();
                match written {
                    Ok(((layer, cache), counts, clone)) => {
                        let took = t.elapsed();
                        shared.cache_writers.locked().push(cache);
                        let pages = save.pages().len() as u64;
                        if l.track_dirty {
                            l.parent = Some(layer);
                        }
                        l.taken += 1;
                        drop(l);
                        console::message(&format!(
                            "Snapshot-saved-before-write = {} pages ({} before a guest write, {} before a device write, of {pages})",
                            counts.guest + counts.vmm,
                            counts.guest,
                            counts.vmm
                        ));
                        let lines = report(&name, diff, pages, took, &clone);
                        lines.iter().for_each(|l| console::message(l));
                        Ok(written_layer(&name, diff, pages, took))
                    }
                    Err(e) => {
                        // Nothing was committed: the next layer holds what
                        // this one would have.
                        if let Some(p) = carry.0.take() {
                            l.carry_pages.extend(p);
                        }
                        l.carry_chunks.append(&mut carry.1);
                        drop(l);
                        let msg = format!("'{name}' failed, nothing was written: {e:#}");
                        console::message(&format!("[snapshot] {msg}"));
                        Err(msg)
                    }
                }
            })
            .context("cannot start the snapshot writer thread")?;
        *self.shared.snapshot_writer.locked() = Some(BackgroundWriter {
            thread,
            pause_us: 0,
            go: Some(go),
        });
        Ok(to_protect)
    }
}

/// A background layer's writer thread.
pub(in crate::machine) struct BackgroundWriter {
    thread: std::thread::JoinHandle<Result<Written, String>>,
    /// The snapshot's pause, once it is over.
    pause_us: u64,
    /// Dropped to let the thread start.
    go: Option<std::sync::mpsc::Sender<()>>,
}

/// Waits for the background layer being written, if any (`say`: tells the
/// console when that takes a while), and returns how it went.
pub(in crate::machine) fn finish_background(
    shared: &Shared,
    say: bool,
) -> Option<Result<Written, String>> {
    let mut w = shared.snapshot_writer.locked().take()?;
    w.go = None;
    if say && !w.thread.is_finished() {
        console::message("[snapshot] waiting for the previous snapshot to be written");
    }
    let r = w
        .thread
        .join()
        .unwrap_or_else(|_| Err("the snapshot writer thread panicked".into()));
    Some(r.map(|written| Written {
        pause_us: w.pause_us,
        ..written
    }))
}

/// Whether a background layer is being written.
pub(in crate::machine) fn background_busy(shared: &Shared) -> bool {
    shared
        .snapshot_writer
        .locked()
        .as_ref()
        .is_some_and(|w| !w.thread.is_finished())
}

/// A layer's [`Written`] record (`pause_us` filled in by the caller).
fn written_layer(name: &str, diff: bool, pages: u64, took: Duration) -> Written {
    Written {
        name: name.to_string(),
        kind: if diff { "diff" } else { "full" },
        pages,
        pause_us: 0,
        write_ms: took.as_millis() as u64,
    }
}

/// Completes the layer's disk: the copy begun (`begun`), or the parent's
/// image reused; with whether it is the parent's.
fn finish_disk(w: &mut SnapshotWriter, begun: bool) -> anyhow::Result<(DiskClone, bool)> {
    Ok(if begun {
        (w.complete_disk()?, false)
    } else {
        (w.reuse_parent_disk()?, true)
    })
}

/// The console lines of a written layer: the write time, the disk clone
/// (and whether it is the parent's image), and the summary.
fn report(
    name: &str,
    diff: bool,
    pages: u64,
    took: Duration,
    (clone, disk_reused): &(DiskClone, bool),
) -> Vec<String> {
    vec![
        format!("Snapshot-write-time = {} ms", took.as_millis()),
        format!(
            "Snapshot-disk-clone = {} ({} of {} chunks hashed{})",
            clone.method,
            clone.hashed,
            clone.chunks,
            if *disk_reused {
                ": unchanged since the parent, its image and digests reused".to_string()
            } else if clone.before_write > 0 {
                format!(": {} copied before a guest write", clone.before_write)
            } else {
                String::new()
            }
        ),
        format!(
            "[snapshot] {} '{name}' ({pages} pages, {:.1} MiB) written",
            if diff { "diff" } else { "full" },
            (pages * PAGE_SIZE) as f64 / (1024.0 * 1024.0)
        ),
    ]
}

/// `ignition-vmm <version>`, recorded in manifests.
fn creator() -> String {
    format!("ignition-vmm {}", env!("CARGO_PKG_VERSION"))
}

impl<V: Vm> crate::machine::control_socket::Operations for Snapshotter<V> {
    fn snapshot(&mut self, name: Option<String>) -> Result<Written, String> {
        match Snapshotter::snapshot(self, name)? {
            Some(w) => Ok(w),
            None => finish_background(&self.shared, false)
                .unwrap_or_else(|| Err("the snapshot writer is gone".into())),
        }
    }

    fn pause(&mut self) -> Result<(), String> {
        Snapshotter::pause(self)
    }

    fn resume(&mut self) -> Result<(), String> {
        Snapshotter::resume(self)
    }

    fn paused(&self) -> bool {
        Snapshotter::paused(self)
    }

    fn parent(&self) -> Option<String> {
        self.parent_name()
    }

    fn dirty_pages(&self) -> usize {
        self.dirty_pages_pending()
    }

    fn writing(&self) -> bool {
        background_busy(&self.shared)
    }
}
