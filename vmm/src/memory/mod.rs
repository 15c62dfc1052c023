//! Guest RAM: one host mapping that the VMM owns, shared by the hypervisor
//! backend (which maps it into the guest) and the devices (which reach it
//! through vm-memory, so every VMM write is recorded in a dirty bitmap).
//!
//! Page bitmaps of guest RAM ([`PageBitmap`]) have one bit per 16 KiB page
//! ([`PAGE_SIZE`]): the VMM's writes (vm-memory's dirty bitmap), the
//! guest's writes and write protection (the backends').

mod bitmap;
mod page_save;

pub use bitmap::PageBitmap;
// The backends' tests hold a background snapshot's writer.
#[cfg(all(test, any(emu, feature = "hvf-sim")))]
pub(crate) use page_save::HeldWriter;
pub use page_save::{forget_saves_in_child, PageSave, SaveCounts, SaveError, Slots};

use crate::arch::layout::{RamRange, PAGE_SIZE, RAM_BASE, RAM_MAX};
use std::sync::Arc;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{GuestAddress, GuestRegionMmap, MmapRegion};

/// Guest memory as devices see it: vm-memory over the VMM's own mapping, with
/// a 16 KiB-granular bitmap of pages the VMM wrote.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<PageBitmap>;

/// Errors creating guest RAM.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The requested size is zero, not a multiple of the page size, or too large.
    #[error("guest RAM size {size} bytes must be a non-zero multiple of {PAGE_SIZE} bytes and at most {RAM_MAX} bytes")]
    BadSize {
        /// Requested size in bytes.
        size: u64,
    },
    /// The host mapping could not be created.
    #[error("cannot map {size} bytes of guest RAM: {source}")]
    Map {
        /// Requested size in bytes.
        size: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// vm-memory refused the region.
    #[error("cannot describe guest RAM to vm-memory: {0}")]
    Region(String),
}

/// Leaves guest RAM out of the process's `fork()`s (`MADV_DONTFORK`, as
/// QEMU does): a branch's source forks with its vCPUs and its children map
/// the layer's memory instead ([`crate::machine::fork`]), so a fork copies
/// none of RAM's page tables and the source's later writes to RAM copy
/// nothing. (`boot` forks for nothing else once RAM exists; `std::process`
/// spawns without copying page tables.)
#[cfg(target_os = "linux")]
fn leave_out_of_forks(map: &mut Mapping) -> std::io::Result<()> {
    // SAFETY: advice on a live mapping `map` owns; it changes only what a
    // fork copies.
    let r = unsafe { libc::madvise(map.as_mut_ptr().cast(), map.len(), libc::MADV_DONTFORK) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// RAM's host mapping, owned: unmapped when dropped.
enum Mapping {
    /// Made by memmap2 (anonymous, or a private map of a memory file).
    Mmap(memmap2::MmapMut),
    /// At an address its maker chose ([`GuestRam::from_fixed`]).
    #[cfg(target_os = "linux")]
    Fixed(snapshot_store::FixedMapping),
}

impl std::ops::Deref for Mapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Mapping::Mmap(m) => m,
            #[cfg(target_os = "linux")]
            Mapping::Fixed(m) => m,
        }
    }
}

impl std::ops::DerefMut for Mapping {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Mapping::Mmap(m) => m,
            #[cfg(target_os = "linux")]
            Mapping::Fixed(m) => m,
        }
    }
}

/// Guest RAM at [`RAM_BASE`]: a page-aligned host mapping of `size` bytes,
/// never in a `fork()` of the process (Linux, `MADV_DONTFORK`).
pub struct GuestRam {
    map: Mapping,
    region: Arc<MmapRegion<PageBitmap>>,
    mem: GuestMemoryMmap,
    /// 1 + this mapping's slot in [`page_save`]'s fault-handler table, 0 if it
    /// has had no background save.
    slot: std::sync::atomic::AtomicUsize,
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        self.release_save_slot();
    }
}

impl GuestRam {
    /// Allocates `size` bytes of zeroed anonymous memory (`size` a multiple of
    /// [`PAGE_SIZE`]). On Linux, in transparent huge pages where the host
    /// allows (`MADV_HUGEPAGE`, as QEMU asks for guest RAM): fewer TLB misses.
    pub fn new_anonymous(size: u64) -> Result<Self, MemoryError> {
        check_size(size)?;
        let len = usize::try_from(size).map_err(|_| MemoryError::BadSize { size })?;
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|source| MemoryError::Map { size, source })?;
        // Advice only: without it (THP off), RAM is the same, in 4 KiB pages.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Self::from_mmap(map)
    }

    /// Wraps an existing writable mapping (e.g. a private copy-on-write map of
    /// a snapshot's memory file). Its length must be a valid RAM size.
    pub fn from_mmap(map: memmap2::MmapMut) -> Result<Self, MemoryError> {
        Self::wrap(Mapping::Mmap(map))
    }

    /// Wraps a mapping at an address its maker chose (a branch's fork maps
    /// the layer's memory where its source's RAM was,
    /// [`crate::machine::fork`]). Its length must be a valid RAM size.
    #[cfg(target_os = "linux")]
    pub fn from_fixed(map: snapshot_store::FixedMapping) -> Result<Self, MemoryError> {
        Self::wrap(Mapping::Fixed(map))
    }

    fn wrap(mut map: Mapping) -> Result<Self, MemoryError> {
        let size = map.len() as u64;
        check_size(size)?;
        #[cfg(target_os = "linux")]
        leave_out_of_forks(&mut map).map_err(|source| MemoryError::Map { size, source })?;
        let bitmap = PageBitmap::new(map.len() / PAGE_SIZE as usize);
        // SAFETY: `map` is a live read/write mapping of `map.len()` bytes that
        // this struct owns and keeps alive as long as the region (vm-memory
        // does not unmap a region built from a raw pointer, and `GuestRam`
        // hands out the region only by reference).
        let region = unsafe {
            MmapRegionBuilder::new_with_bitmap(map.len(), bitmap)
                .with_raw_mmap_pointer(map.as_mut_ptr())
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_ANONYMOUS | libc::MAP_PRIVATE)
                .build()
        }
        .map_err(|e| MemoryError::Region(e.to_string()))?;
        let region = Arc::new(region);
        let guest_region = GuestRegionMmap::with_arc(region.clone(), GuestAddress(RAM_BASE))
            .ok_or_else(|| MemoryError::Region("region wraps the address space".into()))?;
        let mem = GuestMemoryMmap::from_regions(vec![guest_region])
            .map_err(|e| MemoryError::Region(e.to_string()))?;
        Ok(GuestRam {
            map,
            region,
            mem,
            slot: Default::default(),
        })
    }

    /// Guest-physical base address ([`RAM_BASE`]).
    pub fn base(&self) -> u64 {
        RAM_BASE
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// A clear [`PageBitmap`] covering this RAM.
    pub fn page_bitmap(&self) -> PageBitmap {
        PageBitmap::new(self.map.len() / PAGE_SIZE as usize)
    }

    /// RAM's guest-physical range.
    pub fn range(&self) -> RamRange {
        RamRange {
            base: RAM_BASE,
            size: self.size(),
        }
    }

    /// Whether `[gpa, gpa+len)` lies inside RAM.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        self.range().contains_range(gpa, len)
    }

    /// Host address of the first byte of RAM, for mapping it into a backend.
    /// The memory is shared with a running guest: access it only through
    /// [`GuestRam::memory`] or volatile/atomic operations.
    pub fn host_ptr(&self) -> *mut u8 {
        self.map.as_ptr().cast_mut()
    }

    /// All of RAM as a byte slice, for writing a snapshot.
    ///
    /// # Safety
    ///
    /// Nothing may write guest RAM while the slice is alive: every vCPU must
    /// be stopped and no device may be processing a request.
    pub unsafe fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The page indices (16 KiB pages from the start of RAM, ascending) the
    /// VMM wrote since [`GuestRam::vmm_dirty`] was last reset.
    pub fn vmm_dirty_pages(&self) -> Vec<u64> {
        self.vmm_dirty().marked()
    }

    /// vm-memory's view, used by devices. Writes through it are recorded in
    /// [`GuestRam::vmm_dirty`].
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Pages (16 KiB) the VMM itself wrote through [`GuestRam::memory`]
    /// since the bitmap was last reset.
    pub fn vmm_dirty(&self) -> &PageBitmap {
        self.region.bitmap()
    }
}

fn check_size(size: u64) -> Result<(), MemoryError> {
    if size == 0 || size % PAGE_SIZE != 0 || size > RAM_MAX {
        return Err(MemoryError::BadSize { size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    /// Whether `[addr, addr+len)` is mapped in a child of `fork()`.
    #[cfg(target_os = "linux")]
    fn mapped_in_a_fork(addr: *mut u8, len: usize) -> bool {
        // SAFETY: the child only calls msync and _exit (async-signal-safe).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: msync of a range this process may not have mapped
            // answers ENOMEM; it reads nothing.
            let r = unsafe { libc::msync(addr.cast(), len, libc::MS_ASYNC) };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if r == 0 { 0 } else { 1 }) }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        libc::WEXITSTATUS(status) == 0
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn ram_is_not_in_a_fork_and_stays_in_the_parent() {
        let ram = GuestRam::new_anonymous(4 * PAGE_SIZE).unwrap();
        ram.memory()
            .write_slice(&[7u8; 8], GuestAddress(ram.base()))
            .unwrap();
        let len = ram.size() as usize;
        assert!(!mapped_in_a_fork(ram.host_ptr(), len));
        let other = memmap2::MmapMut::map_anon(len).unwrap();
        assert!(mapped_in_a_fork(other.as_ptr().cast_mut(), len));
        let wrapped = GuestRam::from_mmap(other).unwrap();
        assert!(!mapped_in_a_fork(wrapped.host_ptr(), len));
        let mut b = [0u8; 8];
        ram.memory()
            .read_slice(&mut b, GuestAddress(ram.base()))
            .unwrap();
        assert_eq!(b, [7u8; 8]);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(GuestRam::new_anonymous(0).is_err());
        assert!(GuestRam::new_anonymous(PAGE_SIZE + 4096).is_err());
    }

    #[test]
    fn vmm_writes_are_recorded_per_16k_page() {
        let ram = GuestRam::new_anonymous(4 * PAGE_SIZE).unwrap();
        ram.memory()
            .write_obj(0xabu8, GuestAddress(RAM_BASE + 2 * PAGE_SIZE + 5))
            .unwrap();
        ram.memory()
            .write_slice(&[1u8; 2], GuestAddress(RAM_BASE + PAGE_SIZE - 1))
            .unwrap();
        assert_eq!(ram.vmm_dirty_pages(), [0, 1, 2]);
        // Listing does not clear: a failed snapshot loses nothing.
        assert_eq!(ram.vmm_dirty_pages(), [0, 1, 2]);
        ram.vmm_dirty().clear_all();
        assert!(ram.vmm_dirty_pages().is_empty());
        assert_eq!(ram.page_bitmap().len(), 4);
        assert_eq!(ram.vmm_dirty().len(), 4);
        assert!(ram.contains(RAM_BASE, 4 * PAGE_SIZE));
        assert!(!ram.contains(RAM_BASE, 4 * PAGE_SIZE + 1));
        assert!(!ram.contains(u64::MAX - 1, 4));
    }

    #[test]
    fn dirty_pages_from_many_threads() {
        let d = Arc::new(PageBitmap::new(4096));
        let handles: Vec<_> = (0..4usize)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for p in (t..4096).step_by(4) {
                        d.set(p);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(d.marked(), (0..4096).collect::<Vec<_>>());
    }
}
