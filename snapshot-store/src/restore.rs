//! Restoring memory: map the base copy-on-write, overlay diffs by copying.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};

use crate::error::{Error, IoContext, Result};
use crate::format::diff::DiffHeader;
use crate::format::manifest::LayerKind;
use crate::fsutil::{open_regular, Links};
use crate::layer::{Chain, Layer};
use crate::readers::{check_diff_against_manifest, read_diff_prefix};

fn ram_len(layer: &Layer) -> Result<usize> {
    usize::try_from(layer.manifest.ram_size).map_err(|_| {
        Error::Usage(format!(
            "'{}': RAM of {} bytes does not fit this host's address space",
            layer.name, layer.manifest.ram_size
        ))
    })
}

/// Map the base layer's `memory.bin` privately, copy-on-write
/// (`MAP_PRIVATE`): pages are read lazily from the file, and writes
/// (overlays, the guest) go to anonymous copies, never to the store.
/// Returns `ram_size` bytes of guest RAM.
///
/// The store's files are immutable (read-only, never rewritten; removal
/// unlinks), which is what makes a private file mapping stable; call
/// [`crate::verify_chain_cached`] (or [`crate::verify_chain`]) first.
pub fn map_base_memory(base: &Layer) -> Result<MmapMut> {
    let (f, len, path) = open_base(base)?;
    // SAFETY: a MAP_PRIVATE mapping of a file opened read-only. Our writes
    // stay private. The file itself is never modified by the store after
    // commit (mode 0444, no writers), so the mapping's contents do not
    // change underneath us; truncation by a third party would fault, which
    // is the documented hazard of file mappings.
    let map = unsafe { MmapOptions::new().len(len).map_copy(&f) }.ctx(&path, "mmap")?;
    Ok(map)
}

/// The base layer's `memory.bin`, opened and checked (a full layer, the
/// file as long as the manifest's RAM): the file, RAM's length and the path.
fn open_base(base: &Layer) -> Result<(File, usize, std::path::PathBuf)> {
    let path = base.memory_path();
    if base.manifest.kind != LayerKind::Full {
        return Err(Error::Usage(format!(
            "'{}' is a diff layer; only a full layer can be the base",
            base.name
        )));
    }
    let len = ram_len(base)?;
    let f = open_regular(&path, Links::Refuse)?;
    let file_len = f.metadata().ctx(&path, "stat")?.len();
    if file_len != base.manifest.ram_size {
        return Err(Error::corrupt(
            &path,
            format!(
                "is {file_len} bytes, the RAM size in manifest.json is {}",
                base.manifest.ram_size
            ),
        ));
    }
    Ok((f, len, path))
}

/// An opened, checked diff file: its header and page index.
struct OpenDiff {
    file: File,
    header: DiffHeader,
    index: Vec<u64>,
}

/// Opens `layer`'s diff and checks header, index and sizes against the
/// manifest and against a RAM buffer of `ram_len` bytes.
fn open_diff(layer: &Layer, ram_len: usize) -> Result<OpenDiff> {
    let path = layer.memory_path();
    let m = &layer.manifest;
    if m.kind != LayerKind::Diff {
        return Err(Error::Usage(format!(
            "'{}' is not a diff layer",
            layer.name
        )));
    }
    if ram_len as u64 != m.ram_size {
        return Err(Error::Usage(format!(
            "RAM buffer is {} bytes, '{}' has {} bytes of RAM",
            ram_len, layer.name, m.ram_size
        )));
    }
    let file = open_regular(&path, Links::Refuse)?;
    let file_len = file.metadata().ctx(&path, "stat")?.len();
    if file_len != m.memory.size {
        return Err(Error::corrupt(
            &path,
            format!("is {file_len} bytes, manifest.json says {}", m.memory.size),
        ));
    }
    let (header, index) = read_diff_prefix(&file, &path, file_len)?;
    check_diff_against_manifest(m, &path, &header)?;
    Ok(OpenDiff {
        file,
        header,
        index,
    })
}

/// A run of pages that one diff supplies in the merged view of a chain:
/// `len` pages at RAM page `page`, stored from index position `pos` of diff
/// `layer` (consecutive in RAM and in that diff's packed data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    layer: usize,
    page: u64,
    pos: usize,
    len: usize,
}

/// The merged overlay plan of `indexes` (each diff's page index, in chain
/// order): for every page some diff stores, the run of the LAST diff that
/// stores it, so each page is placed once however many layers wrote it.
/// Runs are sorted by RAM page.
fn merged_runs(indexes: &[&[u64]]) -> Vec<Run> {
    // (page, layer, pos); sorting by page and then by descending layer puts
    // the winning copy of each page first.
    let mut entries: Vec<(u64, usize, usize)> = indexes
        .iter()
        .enumerate()
        .flat_map(|(layer, idx)| idx.iter().enumerate().map(move |(pos, &p)| (p, layer, pos)))
        .collect();
    if indexes.len() > 1 {
        entries.sort_unstable_by_key(|&(page, layer, _)| (page, std::cmp::Reverse(layer)));
        entries.dedup_by_key(|e| e.0);
    }
    let mut runs: Vec<Run> = Vec::new();
    for (page, layer, pos) in entries {
        match runs.last_mut() {
            Some(r)
                if r.layer == layer && r.page + r.len as u64 == page && r.pos + r.len == pos =>
            {
                r.len += 1;
            }
            _ => runs.push(Run {
                layer,
                page,
                pos,
                len: 1,
            }),
        }
    }
    runs
}

/// Opens and checks every diff of `diffs` (in chain order) against a RAM
/// buffer of `ram_len` bytes and plans the merged overlay.
fn plan_overlay(diffs: &[Layer], ram_len: usize) -> Result<(Vec<OpenDiff>, Vec<Run>)> {
    let open = diffs
        .iter()
        .map(|l| open_diff(l, ram_len))
        .collect::<Result<Vec<_>>>()?;
    let indexes: Vec<&[u64]> = open.iter().map(|d| d.index.as_slice()).collect();
    let runs = merged_runs(&indexes);
    Ok((open, runs))
}

/// Byte ranges of a run: (offset in RAM, length, offset in the diff file).
fn run_bytes(d: &OpenDiff, r: &Run) -> (usize, usize, u64) {
    // The index entries are below the RAM's page count and the RAM buffer
    // is the RAM's size (open_diff), so these are in bounds.
    let ps = d.header.page_size as usize;
    (
        r.page as usize * ps,
        r.len * ps,
        d.header.data_offset + (r.pos * ps) as u64,
    )
}

fn copy_run(ram: &mut [u8], d: &OpenDiff, r: &Run, path: &Path) -> Result<()> {
    let (dst, len, src) = run_bytes(d, r);
    d.file
        .read_exact_at(&mut ram[dst..dst + len], src)
        .ctx(path, "read")
}

/// Overlay the diff layers `diffs` (in chain order: each the child of the
/// one before, the first a child of the base) onto `ram` (all of guest RAM,
/// `ram_size` bytes) by copying, one read per run of the merged plan: a
/// page that several diffs store is read once, from the last of them.
/// Returns the number of distinct pages placed. Every diff's header, index
/// and sizes are checked against its manifest before anything is copied.
pub fn overlay_diffs(ram: &mut [u8], diffs: &[Layer]) -> Result<u64> {
    let (open, runs) = plan_overlay(diffs, ram.len())?;
    let paths: Vec<_> = diffs.iter().map(Layer::memory_path).collect();
    let mut pages = 0;
    for r in &runs {
        copy_run(ram, &open[r.layer], r, &paths[r.layer])?;
        pages += r.len as u64;
    }
    Ok(pages)
}

/// Most runs a merged overlay maps lazily; past this, pages are copied (each
/// run is a kernel mapping, and a process has a limited number).
pub const MAX_LAZY_RUNS: usize = 8192;

/// Overlay the diff layers `diffs` (in chain order) onto `ram`, a mapping of
/// all of guest RAM (from [`map_base_memory`]), without reading their pages.
/// The diffs are first merged into one plan in which each page comes from
/// the last diff that stores it, so a page that several layers wrote costs
/// nothing extra; then each run of the plan is mapped privately,
/// copy-on-write, from its diff file over the base (`mmap` with
/// `MAP_FIXED | MAP_PRIVATE`): one system call per run whatever the page
/// count, and pages are read when the guest touches them. Returns the number
/// of distinct pages placed.
///
/// Runs of a diff whose page data is not aligned to the host page size are
/// copied, as is everything when the plan has more than [`MAX_LAZY_RUNS`]
/// runs, and always on macOS: Hypervisor.framework's `hv_vm_map` needs guest
/// RAM to be a single VM region, which per-run file mappings would split.
pub fn overlay_diffs_mapped(ram: &mut [u8], diffs: &[Layer]) -> Result<u64> {
    if cfg!(target_os = "macos") {
        return overlay_diffs(ram, diffs);
    }
    let (open, runs) = plan_overlay(diffs, ram.len())?;
    let paths: Vec<_> = diffs.iter().map(Layer::memory_path).collect();
    // SAFETY: sysconf has no preconditions.
    let host_page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let host_page = usize::try_from(host_page).unwrap_or(0);
    let lazy_ok = runs.len() <= MAX_LAZY_RUNS && host_page > 0;
    let aligned: Vec<bool> = open
        .iter()
        .map(|d| {
            lazy_ok
                && d.header.page_size as usize % host_page == 0
                && d.header.data_offset % host_page as u64 == 0
        })
        .collect();
    let mut pages = 0;
    for r in &runs {
        let d = &open[r.layer];
        let path = &paths[r.layer];
        pages += r.len as u64;
        if !aligned[r.layer] {
            copy_run(ram, d, r, path)?;
            continue;
        }
        let (dst, len, src) = run_bytes(d, r);
        let off = libc::off_t::try_from(src)
            .map_err(|_| Error::corrupt(path, "page data offset overflows off_t"))?;
        let base = ram.as_mut_ptr();
        // SAFETY: `dst + len <= ram.len()` (open_diff checked every index
        // entry is below the RAM's page count and the buffer is the RAM's
        // size), so the fixed mapping replaces pages inside `ram`'s own
        // mapping and nothing else; `base + dst` is host-page-aligned (the
        // page size is a multiple of the host page). The new mapping is
        // private, so guest writes never reach the store's file. `ram`
        // keeps owning the whole range and unmaps it on drop.
        let p = unsafe {
            libc::mmap(
                base.add(dst).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                std::os::fd::AsRawFd::as_raw_fd(&d.file),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(path, "mmap", std::io::Error::last_os_error()));
        }
    }
    Ok(pages)
}

/// Guest RAM for `chain`: the base mapped copy-on-write
/// ([`map_base_memory`]) with its diffs overlaid ([`overlay_diffs_mapped`]).
/// Verify the chain ([`crate::verify_chain_cached`] or
/// [`crate::verify_chain`]) before running a guest on the result.
pub fn map_chain_memory(chain: &Chain) -> Result<MmapMut> {
    let mut ram = map_base_memory(chain.base())?;
    overlay_diffs_mapped(&mut ram, &chain.layers()[1..])?;
    Ok(ram)
}

/// A private mapping at a host address the caller chose
/// ([`map_chain_memory_at`]), unmapped when dropped.
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub struct FixedMapping {
    addr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; sharing it
// between threads is as safe as sharing a `memmap2::MmapMut`.
#[cfg(target_os = "linux")]
unsafe impl Send for FixedMapping {}
// SAFETY: as above.
#[cfg(target_os = "linux")]
unsafe impl Sync for FixedMapping {}

#[cfg(target_os = "linux")]
impl std::ops::Deref for FixedMapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `addr` is a live mapping of `len` readable bytes owned by
        // `self`.
        unsafe { std::slice::from_raw_parts(self.addr.as_ptr(), self.len) }
    }
}

#[cfg(target_os = "linux")]
impl std::ops::DerefMut for FixedMapping {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and the mapping is writable (private).
        unsafe { std::slice::from_raw_parts_mut(self.addr.as_ptr(), self.len) }
    }
}

#[cfg(target_os = "linux")]
impl Drop for FixedMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range this value owns.
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

/// [`map_chain_memory`] at host address `addr`, where nothing may be mapped
/// (`MAP_FIXED_NOREPLACE`: an error if anything is): for a process that
/// must find guest RAM where another process had it (a branch's fork, whose
/// vCPUs hold RAM's address). `addr` must be aligned to the host's page.
#[cfg(target_os = "linux")]
pub fn map_chain_memory_at(chain: &Chain, addr: usize) -> Result<FixedMapping> {
    let (f, len, path) = open_base(chain.base())?;
    // SAFETY: a new private mapping of a file opened read-only, where
    // MAP_FIXED_NOREPLACE guarantees nothing is replaced (as in
    // `map_base_memory`, the store's files are never modified).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED_NOREPLACE,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::io(&path, "mmap", std::io::Error::last_os_error()));
    }
    let Some(ptr) = std::ptr::NonNull::new(p.cast::<u8>()) else {
        return Err(Error::corrupt(&path, "mapped at address 0"));
    };
    let mut map = FixedMapping { addr: ptr, len };
    if p as usize != addr {
        // A kernel older than 4.17 takes the address as a hint.
        return Err(Error::io(
            &path,
            "mmap",
            std::io::Error::other(format!("mapped at {p:?}, not at {addr:#x}")),
        ));
    }
    overlay_diffs_mapped(&mut map, &chain.layers()[1..])?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(layer: usize, page: u64, pos: usize, len: usize) -> Run {
        Run {
            layer,
            page,
            pos,
            len,
        }
    }

    #[test]
    fn one_diff_runs_follow_its_index() {
        let idx: &[u64] = &[1, 2, 3, 7, 9, 10];
        assert_eq!(
            merged_runs(&[idx]),
            vec![run(0, 1, 0, 3), run(0, 7, 3, 1), run(0, 9, 4, 2)]
        );
        assert!(merged_runs(&[]).is_empty());
    }

    #[test]
    fn later_diffs_win_and_split_runs() {
        let a: &[u64] = &[0, 1, 2, 3, 4, 5];
        let b: &[u64] = &[2, 3, 8];
        let c: &[u64] = &[3];
        assert_eq!(
            merged_runs(&[a, b, c]),
            vec![
                run(0, 0, 0, 2),
                run(1, 2, 0, 1),
                run(2, 3, 0, 1),
                run(0, 4, 4, 2),
                run(1, 8, 2, 1),
            ]
        );
    }

    #[test]
    fn identical_diffs_collapse_to_the_last() {
        let a: &[u64] = &[5, 6, 7];
        assert_eq!(merged_runs(&[a, a, a]), vec![run(2, 5, 0, 3)]);
    }

    #[test]
    fn merged_plan_matches_applying_layers_in_order() {
        // A deterministic pseudo-random sweep: the plan must place, for every
        // page, the copy of the last layer that has it, and nothing else.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let layers = 1 + (next() % 5) as usize;
            let idxs: Vec<Vec<u64>> = (0..layers)
                .map(|_| (0..64).filter(|_| next() % 3 == 0).collect())
                .collect();
            let mut want = [None::<(usize, usize)>; 64];
            for (l, idx) in idxs.iter().enumerate() {
                for (pos, &p) in idx.iter().enumerate() {
                    want[p as usize] = Some((l, pos));
                }
            }
            let refs: Vec<&[u64]> = idxs.iter().map(Vec::as_slice).collect();
            let mut got = [None::<(usize, usize)>; 64];
            for r in merged_runs(&refs) {
                for k in 0..r.len {
                    let slot = &mut got[r.page as usize + k];
                    assert!(slot.is_none(), "page placed twice");
                    *slot = Some((r.layer, r.pos + k));
                }
            }
            assert_eq!(got, want);
        }
    }
}
