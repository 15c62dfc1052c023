//! Restoring memory: map the base copy-on-write, overlay diffs by copying.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};

use crate::diff::{parse_diff_header, parse_diff_prefix, DiffHeader, DIFF_HEADER_LEN};
use crate::error::{Error, IoContext, Result};
use crate::manifest::LayerKind;
use crate::state::read_up_to;
use crate::store::{Chain, Layer};

/// Read and check the header, index and padding of the diff file at
/// `path`, whose length is `file_len`. Reads at most the prefix, which
/// the header check bounds by the real file size.
pub(crate) fn read_diff_prefix(
    f: &File,
    path: &Path,
    file_len: u64,
) -> Result<(DiffHeader, Vec<u64>)> {
    let mut head = [0u8; DIFF_HEADER_LEN];
    let got = read_up_to(&mut &*f, &mut head).ctx(path, "read")?;
    let h = parse_diff_header(&head[..got]).map_err(|e| Error::corrupt(path, e.0))?;
    if file_len != h.file_size() {
        return Err(Error::corrupt(
            path,
            format!(
                "file is {file_len} bytes, but its header announces {} ({} pages)",
                h.file_size(),
                h.page_count
            ),
        ));
    }
    let mut prefix = vec![0u8; h.data_offset as usize];
    f.read_exact_at(&mut prefix, 0).ctx(path, "read")?;
    parse_diff_prefix(&prefix).map_err(|e| Error::corrupt(path, e.0))
}

/// Check a diff header against the layer's manifest.
pub(crate) fn check_diff_against_manifest(layer: &Layer, h: &DiffHeader) -> Result<()> {
    let m = &layer.manifest;
    if h.page_size != m.page_size || h.ram_size != m.ram_size || Some(h.page_count) != m.diff_pages
    {
        return Err(Error::corrupt(
            layer.memory_path(),
            format!(
                "header says {} pages of {} bytes over {} bytes of RAM; manifest.json says {} pages of {} bytes over {}",
                h.page_count,
                h.page_size,
                h.ram_size,
                m.diff_pages.unwrap_or(0),
                m.page_size,
                m.ram_size
            ),
        ));
    }
    Ok(())
}

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
    let path = base.memory_path();
    if base.manifest.kind != LayerKind::Full {
        return Err(Error::Usage(format!(
            "'{}' is a diff layer; only a full layer can be the base",
            base.name
        )));
    }
    let len = ram_len(base)?;
    let f = File::open(&path).ctx(&path, "open")?;
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
    // SAFETY: a MAP_PRIVATE mapping of a file opened read-only. Our writes
    // stay private. The file itself is never modified by the store after
    // commit (mode 0444, no writers), so the mapping's contents do not
    // change underneath us; truncation by a third party would fault, which
    // is the documented hazard of file mappings.
    let map = unsafe { MmapOptions::new().len(len).map_copy(&f) }.ctx(&path, "mmap")?;
    Ok(map)
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
    let file = File::open(&path).ctx(&path, "open")?;
    let file_len = file.metadata().ctx(&path, "stat")?.len();
    if file_len != m.memory.size {
        return Err(Error::corrupt(
            &path,
            format!("is {file_len} bytes, manifest.json says {}", m.memory.size),
        ));
    }
    let (header, index) = read_diff_prefix(&file, &path, file_len)?;
    check_diff_against_manifest(layer, &header)?;
    Ok(OpenDiff {
        file,
        header,
        index,
    })
}

/// Runs of consecutive pages in a diff index: `(first index position,
/// number of pages)`. Page data is packed in index order, so each run is
/// also contiguous in the file.
fn runs(index: &[u64]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < index.len() {
        let mut j = i + 1;
        while j < index.len() && index[j] == index[j - 1] + 1 {
            j += 1;
        }
        out.push((i, j - i));
        i = j;
    }
    out
}

/// Copy the pages of the diff layer `layer` into `ram` (all of guest RAM,
/// `ram_size` bytes), reading runs of consecutive pages with one read each.
/// Returns the number of pages copied. Header, index and sizes are checked
/// against the manifest before anything is copied.
pub fn overlay_diff(ram: &mut [u8], layer: &Layer) -> Result<u64> {
    let d = open_diff(layer, ram.len())?;
    let path = layer.memory_path();
    let ps = d.header.page_size as usize;
    for (i, n) in runs(&d.index) {
        // index[] < ram_pages and ram.len() == ram_size: in bounds.
        let dst = d.index[i] as usize * ps;
        let len = n * ps;
        let src = d.header.data_offset + (i * ps) as u64;
        d.file
            .read_exact_at(&mut ram[dst..dst + len], src)
            .ctx(&path, "read")?;
    }
    Ok(d.index.len() as u64)
}

/// Most runs one diff may map lazily; past this, its pages are copied (each
/// run is a kernel mapping, and a process has a limited number).
pub const MAX_LAZY_RUNS: usize = 8192;

/// Overlay the diff layer `layer` onto `ram`, a mapping of all of guest RAM
/// (from [`map_base_memory`]), without reading its pages: each run of
/// consecutive pages is mapped privately, copy-on-write, from the diff file
/// over the base (`mmap` with `MAP_FIXED | MAP_PRIVATE`), so the cost is one
/// system call per run whatever the page count, and pages are read when the
/// guest touches them. Returns the number of pages overlaid.
///
/// Falls back to [`overlay_diff`]'s copy when the page data is not aligned to
/// the host page size, when the diff has more than [`MAX_LAZY_RUNS`] runs,
/// and always on macOS: Hypervisor.framework's `hv_vm_map` needs guest RAM
/// to be a single VM region, which per-run file mappings would split.
pub fn overlay_diff_mapped(ram: &mut MmapMut, layer: &Layer) -> Result<u64> {
    if cfg!(target_os = "macos") {
        return overlay_diff(ram, layer);
    }
    let d = open_diff(layer, ram.len())?;
    let ps = d.header.page_size as usize;
    // SAFETY: sysconf has no preconditions.
    let host_page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let host_page = usize::try_from(host_page).unwrap_or(0);
    let runs = runs(&d.index);
    let aligned =
        host_page > 0 && ps % host_page == 0 && d.header.data_offset % host_page as u64 == 0;
    if !aligned || runs.len() > MAX_LAZY_RUNS {
        drop(d);
        return overlay_diff(ram, layer);
    }
    let path = layer.memory_path();
    let base = ram.as_mut_ptr();
    for (i, n) in runs {
        let dst = d.index[i] as usize * ps;
        let len = n * ps;
        let src = d.header.data_offset + (i * ps) as u64;
        let off = libc::off_t::try_from(src)
            .map_err(|_| Error::corrupt(&path, "page data offset overflows off_t"))?;
        // SAFETY: `dst + len <= ram.len()` (open_diff checked every index
        // entry is below the RAM's page count and the buffer is the RAM's
        // size), so the fixed mapping replaces pages inside `ram`'s own
        // mapping and nothing else; `base + dst` is page-aligned (`ps` is a
        // multiple of the host page). The new mapping is private, so guest
        // writes never reach the store's file. `ram` keeps owning the whole
        // range and unmaps it on drop.
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
            return Err(Error::io(&path, "mmap", std::io::Error::last_os_error()));
        }
    }
    Ok(d.index.len() as u64)
}

/// Guest RAM for `chain`: the base mapped copy-on-write
/// ([`map_base_memory`]) with each diff overlaid in order
/// ([`overlay_diff_mapped`]). Verify the chain ([`crate::verify_chain_cached`] or
/// [`crate::verify_chain`]) before running a guest on the result.
pub fn map_chain_memory(chain: &Chain) -> Result<MmapMut> {
    let mut ram = map_base_memory(chain.base())?;
    for layer in &chain.layers()[1..] {
        overlay_diff_mapped(&mut ram, layer)?;
    }
    Ok(ram)
}
