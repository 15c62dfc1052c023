//! A background layer's writer thread: it saves the layer's pages while
//! the guest runs, writes the state and the disk, commits the layer, and
//! records the outcome in the lineage (the next layer's parent, or what it
//! must carry when this one failed). Also the console report of a layer.

use crate::arch::layout::PAGE_SIZE;
use crate::console;
use crate::machine::ops::{SnapshotError, Written};
use crate::memory::PageSave;
use crate::sync::Locked;
use anyhow::Context;
use snapshot_store::{DiskClone, Layer, MemoryFile, SnapshotWriter};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the next layer builds on; updated by a background layer's writer
/// when it finishes.
pub(super) struct Lineage {
    /// Snapshots written in this run.
    pub(super) taken: u32,
    /// Dirty tracking is armed (it stops if re-arming fails).
    pub(super) track_dirty: bool,
    /// The layer the next snapshot is a diff against, when tracking.
    pub(super) parent: Option<Layer>,
    /// Pages and disk chunks of a background layer that failed: dirtied
    /// since `parent`, so the next layer holds them.
    pub(super) carry_pages: Vec<u64>,
    pub(super) carry_chunks: Vec<u64>,
}

/// A layer's writer, opened before the VM stops (the store's checks of the
/// name and the parent, the work directory and the memory file are file
/// system work the pause need not wait for).
pub(super) struct Opened {
    pub(super) w: SnapshotWriter,
    /// A diff (the layer has a parent).
    pub(super) diff: bool,
    /// A background layer's writer thread.
    pub(super) idle: Option<IdleWriter>,
}

/// A layer begun while the VM is stopped: its writer with the disk's copy
/// begun, and what the memory must hold.
pub(super) struct Begun {
    pub(super) name: String,
    pub(super) w: SnapshotWriter,
    /// The encoded machine state.
    pub(super) state: Vec<u8>,
    pub(super) diff: bool,
    /// The disk's copy is begun (`false`: the layer reuses the parent's
    /// image); [`finish_disk`] completes either.
    pub(super) disk_begun: bool,
    /// The disk chunks written since the parent (for a diff).
    pub(super) chunks: Vec<u64>,
}

/// Threads recording committed layers' verified-file caches, by layer name.
pub(super) type CacheWriters = Arc<Mutex<Vec<(String, JoinHandle<()>)>>>;

/// Where a background layer's writer records how it went.
pub(super) struct Outcome {
    pub(super) lineage: Arc<Mutex<Lineage>>,
    /// Where the committed layer's verified-file cache writer goes.
    pub(super) cache_writers: CacheWriters,
    /// What the next layer must hold if this one fails: its pages (with
    /// tracking) and disk chunks.
    pub(super) carry_pages: Option<Vec<u64>>,
    pub(super) carry_chunks: Vec<u64>,
}

/// A background layer's writer thread.
pub(super) struct BackgroundWriter {
    thread: JoinHandle<Result<Written, SnapshotError>>,
    /// The snapshot's pause, once it is over.
    pause_us: u64,
    /// Dropped to let the thread start.
    go: Option<Sender<()>>,
}

impl BackgroundWriter {
    /// Lets the thread start, the guest running again after a pause of
    /// `pause_us`.
    pub(super) fn start(&mut self, pause_us: u64) {
        self.pause_us = pause_us;
        self.go = None;
    }

    /// Whether the layer is still being written.
    pub(super) fn busy(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Waits for the layer (`say`: tells the console when that takes a
    /// while) and returns how it went.
    pub(super) fn finish(mut self, say: bool) -> Result<Written, SnapshotError> {
        self.go = None;
        if say && self.busy() {
            console::message("[snapshot] waiting for the previous snapshot to be written");
        }
        let pause_us = self.pause_us;
        let r = self.thread.join().unwrap_or_else(|_| {
            Err(SnapshotError::Failed {
                name: String::new(),
                reason: anyhow::anyhow!("the snapshot writer thread panicked"),
            })
        });
        r.map(|w| Written { pause_us, ..w })
    }
}

/// A test hook's gate: waits until `gate` exists, and removes it.
pub(super) fn pass_gate(gate: &Path) {
    while std::fs::remove_file(gate).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A layer's writer thread, started before the pause (starting a thread
/// is kernel work the pause need not wait for). It waits for its layer
/// ([`IdleWriter::start`]), and ends if dropped without one.
pub(super) struct IdleWriter {
    thread: JoinHandle<Result<Written, SnapshotError>>,
    job: Sender<Job>,
}

/// What [`IdleWriter::start`] hands its thread.
struct Job {
    b: Begun,
    memory: MemoryFile,
    save: Arc<PageSave>,
    out: Outcome,
    gate: Option<PathBuf>,
    /// Closed by [`BackgroundWriter::start`].
    go: Receiver<()>,
}

impl IdleWriter {
    /// Starts the thread.
    pub(super) fn spawn() -> anyhow::Result<IdleWriter> {
        let (job, jobs) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("snapshot-writer".into())
            .spawn(move || {
                let Ok(j) = jobs.recv() else {
                    return Err(SnapshotError::Failed {
                        name: String::new(),
                        reason: anyhow::anyhow!("no layer was begun"),
                    });
                };
                // Released (the sender dropped) once the vCPUs run again and
                // the layer's pages are protected.
                let _ = j.go.recv();
                if let Some(gate) = j.gate {
                    pass_gate(&gate);
                }
                write(j.b, j.memory, &j.save, j.out)
            })
            .context("cannot start the snapshot writer thread")?;
        Ok(IdleWriter { thread, job })
    }

    /// Hands the thread the begun layer `b`, whose pages `save` saves into
    /// `memory`; it waits for [`BackgroundWriter::start`] (and for the test
    /// hook's `gate` file, if any) before it saves a page.
    pub(super) fn start(
        self,
        b: Begun,
        memory: MemoryFile,
        save: Arc<PageSave>,
        out: Outcome,
        gate: Option<PathBuf>,
    ) -> BackgroundWriter {
        let (go, wait) = channel::<()>();
        // The thread waits for this (it ends only without a job), so the
        // send reaches it.
        let _ = self.job.send(Job {
            b,
            memory,
            save,
            out,
            gate,
            go: wait,
        });
        BackgroundWriter {
            thread: self.thread,
            pause_us: 0,
            go: Some(go),
        }
    }
}

/// The writer thread's work: the pages, the state, the disk, the commit,
/// and the outcome in the lineage.
fn write(
    b: Begun,
    memory: MemoryFile,
    save: &PageSave,
    mut out: Outcome,
) -> Result<Written, SnapshotError> {
    let t = Instant::now();
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
    let mut l = out.lineage.locked();
    match written {
        Ok(((layer, cache), counts, clone)) => {
            let took = t.elapsed();
            out.cache_writers.locked().push((name.clone(), cache));
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
            Ok(record(&name, diff, pages, took))
        }
        Err(reason) => {
            // Nothing was committed: the next layer holds what this one
            // would have.
            if let Some(p) = out.carry_pages.take() {
                l.carry_pages.extend(p);
            }
            l.carry_chunks.append(&mut out.carry_chunks);
            drop(l);
            let e = SnapshotError::Failed { name, reason };
            console::message(&format!("[snapshot] {e}"));
            Err(e)
        }
    }
}

/// A layer's [`Written`] record (`pause_us` filled in by the caller).
pub(super) fn record(name: &str, diff: bool, pages: u64, took: Duration) -> Written {
    Written {
        name: name.to_string(),
        kind: if diff { "diff" } else { "full" },
        pages,
        pause_us: 0,
        write_ms: took.as_millis() as u64,
    }
}

/// Completes the layer's disk: the copy begun (`begun`), or the parent's
/// disk reused (an empty disk diff); with whether it is the parent's.
pub(super) fn finish_disk(
    w: &mut SnapshotWriter,
    begun: bool,
) -> anyhow::Result<(DiskClone, bool)> {
    Ok(if begun {
        (w.complete_disk()?, false)
    } else {
        (w.reuse_parent_disk()?, true)
    })
}

/// The console lines of a written layer: the write time, how its disk was
/// stored (and whether it is the parent's, unchanged), and the summary.
pub(super) fn report(
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
                ": unchanged since the parent, its digests reused".to_string()
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
