//! A lock-free bitmap with one bit per 16 KiB page of guest RAM, for the
//! backends' dirty tracking and write protection, and vm-memory's record of
//! the VMM's own writes (as its [`Bitmap`], over byte offsets). Bulk
//! operations work a 64-bit word at a time: re-arming write protection for
//! 2 GiB of RAM sets 2048 words, not 131072 bits one by one, and listing
//! the pages of 512 MiB reads 512 words.

use crate::arch::layout::PAGE_SIZE;
use std::sync::atomic::{AtomicU64, Ordering};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};

/// One bit per page (bit `n`: the page at offset `n * PAGE_SIZE` from the
/// start of RAM). Set, cleared and read from any thread without locks;
/// pages at or past [`PageBitmap::len`] are ignored (never set).
#[derive(Debug)]
pub struct PageBitmap {
    words: Box<[AtomicU64]>,
    pages: usize,
}

/// The mask of bits `lo..hi` of a word (`lo < hi <= 64`).
fn mask(lo: usize, hi: usize) -> u64 {
    let high = if hi == 64 { u64::MAX } else { (1u64 << hi) - 1 };
    high & !((1u64 << lo) - 1)
}

impl PageBitmap {
    /// A clear bitmap of `pages` pages.
    pub fn new(pages: usize) -> Self {
        PageBitmap {
            words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            pages,
        }
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.pages
    }

    /// Whether the bitmap covers no page.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Whether page `p` is set (`false` past the end).
    pub fn is_set(&self, p: usize) -> bool {
        p < self.pages && self.words[p / 64].load(Ordering::Acquire) & (1 << (p % 64)) != 0
    }

    /// Sets page `p` (ignored past the end).
    pub fn set(&self, p: usize) {
        if p < self.pages {
            self.words[p / 64].fetch_or(1 << (p % 64), Ordering::AcqRel);
        }
    }

    /// Clears page `p` (ignored past the end).
    pub fn clear(&self, p: usize) {
        if p < self.pages {
            self.words[p / 64].fetch_and(!(1 << (p % 64)), Ordering::AcqRel);
        }
    }

    /// Sets pages `first..first + count` (clipped to the end).
    pub fn set_range(&self, first: usize, count: usize) {
        self.each_word(first, count, |w, m| {
            w.fetch_or(m, Ordering::AcqRel);
        });
    }

    /// Clears pages `first..first + count` (clipped to the end).
    pub fn clear_range(&self, first: usize, count: usize) {
        self.each_word(first, count, |w, m| {
            w.fetch_and(!m, Ordering::AcqRel);
        });
    }

    /// Clears every page.
    pub fn clear_all(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Release);
        }
    }

    /// The set pages, ascending, without clearing them.
    pub fn marked(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, w) in self.words.iter().enumerate() {
            let mut bits = w.load(Ordering::Acquire);
            while bits != 0 {
                out.push((i * 64) as u64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
        out
    }

    /// Calls `f(word, mask)` for each word holding pages of
    /// `first..first + count`, clipped to the end.
    fn each_word(&self, first: usize, count: usize, f: impl Fn(&AtomicU64, u64)) {
        let end = first.saturating_add(count).min(self.pages);
        let mut p = first;
        while p < end {
            let (i, lo) = (p / 64, p % 64);
            let hi = (end - i * 64).min(64);
            f(&self.words[i], mask(lo, hi));
            p = (i + 1) * 64;
        }
    }
}

/// The page that byte `offset` of RAM is in.
fn page_of(offset: usize) -> usize {
    offset / PAGE_SIZE as usize
}

impl Default for PageBitmap {
    fn default() -> Self {
        PageBitmap::new(0)
    }
}

impl<'a> WithBitmapSlice<'a> for PageBitmap {
    type S = RefSlice<'a, Self>;
}

/// vm-memory's view: byte offsets from the start of RAM, each marking the
/// 16 KiB page it is in.
impl Bitmap for PageBitmap {
    fn mark_dirty(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let (first, last) = (page_of(offset), page_of(offset.saturating_add(len - 1)));
        self.set_range(first, last - first + 1);
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.is_set(page_of(offset))
    }

    fn slice_at(&self, offset: usize) -> RefSlice<'_, Self> {
        RefSlice::new(self, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bits of `b`, one by one.
    fn bits(b: &PageBitmap) -> Vec<u64> {
        (0..b.len())
            .filter(|&p| b.is_set(p))
            .map(|p| p as u64)
            .collect()
    }

    #[test]
    fn ranges_match_bit_by_bit_operations() {
        for pages in [1, 63, 64, 65, 130, 200] {
            for (first, count) in [
                (0, 1),
                (0, 64),
                (3, 61),
                (3, 62),
                (60, 10),
                (5, 500),
                (64, 64),
            ] {
                let b = PageBitmap::new(pages);
                b.set_range(first, count);
                let want: Vec<u64> = (first..(first + count).min(pages))
                    .map(|p| p as u64)
                    .collect();
                assert_eq!(bits(&b), want, "set {first}+{count} of {pages}");
                assert_eq!(b.marked(), want);
                b.set_range(0, pages);
                b.clear_range(first, count);
                let want: Vec<u64> = (0..pages)
                    .filter(|p| !(first..first + count).contains(p))
                    .map(|p| p as u64)
                    .collect();
                assert_eq!(b.marked(), want, "clear {first}+{count} of {pages}");
            }
        }
    }

    #[test]
    fn vm_memory_marks_cover_every_16k_page_a_byte_range_touches() {
        let page = PAGE_SIZE as usize;
        let b = PageBitmap::new(200);
        b.mark_dirty(2 * page + 5, 1);
        assert_eq!(b.marked(), [2]);
        assert!(b.dirty_at(2 * page) && b.dirty_at(3 * page - 1) && !b.dirty_at(3 * page));
        b.mark_dirty(60 * page - 1, 2);
        assert_eq!(b.marked(), [2, 59, 60]);
        b.mark_dirty(7 * page, 0);
        b.mark_dirty(150 * page, usize::MAX);
        assert_eq!(b.marked().len(), 3 + 50);
        // A slice's offsets are from where it starts.
        b.clear_all();
        b.slice_at(10 * page).mark_dirty(page, 1);
        assert_eq!(b.marked(), [11]);
    }

    #[test]
    fn single_bits_and_the_end() {
        let b = PageBitmap::new(70);
        b.set(69);
        b.set(70);
        b.set(usize::MAX);
        b.set_range(usize::MAX - 1, 5);
        assert_eq!(b.marked(), [69]);
        assert!(b.is_set(69) && !b.is_set(70) && !b.is_set(usize::MAX));
        b.clear(69);
        assert!(b.marked().is_empty());
        b.set_range(0, 70);
        b.clear_all();
        assert!(b.marked().is_empty());
        assert!(PageBitmap::new(0).is_empty());
    }
}
