//! Ctrl-A s: stopping every vCPU at an instruction boundary, capturing the
//! machine, and writing a layer to the snapshot store.
//!
//! Order (issue-level guarantees): vCPUs park and capture their own state,
//! and the guest's clock stops (one count for the VM, saved once); devices
//! are idle (virtio requests complete inside the MMIO write that queued
//! them, so none is in flight once every vCPU is parked); the layer is
//! written into a temporary directory, fsynced and renamed by the store; only
//! then are the dirty bitmaps cleared and write protection re-armed; then
//! the clock goes on from where it stopped and the vCPUs resume, so the
//! guest sees no time pass however long the snapshot took.

use super::state::{MachineState, VcpuState, MACHINE_STATE_VERSION};
use super::Shared;
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::console;
use crate::devices::Persist;
use crate::hv::Vm;
use crate::sync::Locked;
use anyhow::Context;
use snapshot_store::{Layer, LayerMeta, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Test hook: with `IGNITION_TEST_SNAPSHOT_DELAY_MS=N` in its environment,
/// `boot` keeps the VM paused N ms longer at every snapshot (after the layer
/// is written), so that end-to-end tests can check that guest time stands
/// still across a pause without depending on how fast this machine writes a
/// layer (`scripts/tests/test_clock_e2e.py`).
pub(super) const TEST_DELAY_ENV: &str = "IGNITION_TEST_SNAPSHOT_DELAY_MS";

/// Takes snapshots for one running VM.
pub(super) struct Snapshotter<V: Vm> {
    vm: Arc<V>,
    shared: Arc<Shared>,
    store: PathBuf,
    name: Option<String>,
    /// Snapshots written in this run.
    taken: u32,
    track_dirty: bool,
    /// The layer the next snapshot is a diff against, when tracking.
    parent: Option<Layer>,
    disk: PathBuf,
    cmdline: String,
    backend: &'static str,
    /// The test hook's extra pause ([`TEST_DELAY_ENV`]).
    test_delay: Option<Duration>,
}

impl<V: Vm> Snapshotter<V> {
    pub(super) fn new(
        vm: Arc<V>,
        shared: Arc<Shared>,
        opts: &super::SnapshotOptions,
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
            taken: 0,
            track_dirty: opts.track_dirty,
            parent: if opts.track_dirty { parent } else { None },
            disk,
            cmdline,
            backend,
            test_delay: std::env::var(TEST_DELAY_ENV)
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
        }
    }

    /// The name of the next snapshot: `NAME`, then `NAME.2`, `NAME.3`, ...
    fn next_name(&self) -> Option<String> {
        let base = self.name.as_ref()?;
        Some(match self.taken {
            0 => base.clone(),
            n => format!("{base}.{}", n + 1),
        })
    }

    /// Handles Ctrl-A s: writes a snapshot, or says on the console why not.
    pub(super) fn take(&mut self) {
        let Some(name) = self.next_name() else {
            console::message("[snapshot] refused: no snapshot name (start boot with --name NAME)");
            return;
        };
        let shared = self.shared.clone();
        let (control, clock) = (&shared.control, &shared.clock);
        let states = match control.pause(clock) {
            Ok(s) => s,
            Err(e) => {
                control.resume(clock);
                console::message(&format!("[snapshot] '{name}' failed: {e:#}"));
                return;
            }
        };
        let result = self.write(&name, states);
        if let Some(d) = self.test_delay {
            std::thread::sleep(d);
        }
        control.resume(clock);
        match result {
            Ok(msg) => {
                self.taken += 1;
                console::message(&msg);
            }
            Err(e) => console::message(&format!(
                "[snapshot] '{name}' failed, nothing was written: {e:#}"
            )),
        }
    }

    /// Writes the layer while every vCPU is parked; returns the console line.
    fn write(&mut self, name: &str, vcpus: Vec<VcpuState>) -> anyhow::Result<String> {
        let t = Instant::now();
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
        let meta = LayerMeta {
            parent: self.parent.as_ref().map(Layer::parent_ref),
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
        let written = shared.devices.root_disk().device().written_chunks();
        let (clone, disk_reused) = if diff && written.is_empty() {
            (w.reuse_parent_disk()?, true)
        } else {
            // A restored VM's working disk may still be being copied.
            shared
                .devices
                .root_disk()
                .device_mut()
                .wait_ready()
                .context("the VM's disk image is not usable")?;
            (
                w.clone_disk(&self.disk, diff.then_some(&written[..]))?,
                false,
            )
        };
        // SAFETY: every vCPU is parked (`pause` returned) and the block device
        // is quiesced, so nothing writes guest RAM while `bytes` is alive.
        let bytes = unsafe { ram.bytes() };
        let pages = if diff {
            let mut pages = self.vm.dirty_pages()?;
            pages.extend(ram.vmm_dirty_pages());
            pages.sort_unstable();
            pages.dedup();
            w.write_diff_from_ram(bytes, pages.iter().copied())?
        } else {
            w.write_full_memory(bytes)?;
            ram.size() / PAGE_SIZE
        };
        w.write_state(&state.encode())?;
        let (layer, cache) = w.commit_cache_later()?;
        shared.cache_writers.locked().push(cache);
        let write_ms = t.elapsed().as_millis();
        // The layer is durable: only now forget what was dirty.
        shared
            .devices
            .root_disk()
            .device_mut()
            .clear_written_chunks();
        if self.track_dirty {
            match self.vm.rearm_dirty_tracking() {
                Ok(()) => {
                    ram.vmm_dirty().reset();
                    self.parent = Some(layer);
                }
                Err(e) => {
                    // The layer is fine, but what is dirty is no longer known:
                    // later snapshots of this run are full layers.
                    self.track_dirty = false;
                    self.parent = None;
                    console::message(&format!(
                        "[snapshot] dirty tracking could not be re-armed ({e}); later snapshots are full"
                    ));
                }
            }
        }
        console::message(&format!("Snapshot-write-time = {write_ms} ms"));
        console::message(&format!(
            "Snapshot-disk-clone = {} ({} of {} chunks hashed{})",
            clone.method,
            clone.hashed,
            clone.chunks,
            if disk_reused {
                ": unchanged since the parent, its image and digests reused"
            } else {
                ""
            }
        ));
        Ok(format!(
            "[snapshot] {} '{name}' ({pages} pages, {:.1} MiB) written",
            if diff { "diff" } else { "full" },
            (pages * PAGE_SIZE) as f64 / (1024.0 * 1024.0)
        ))
    }
}

/// `ignition-vmm <version>`, recorded in manifests.
fn creator() -> String {
    format!("ignition-vmm {}", env!("CARGO_PKG_VERSION"))
}
