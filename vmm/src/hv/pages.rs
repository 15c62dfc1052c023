//! [`PageBitmap`]: a lock-free bitmap of guest RAM pages, shared by both
//! backends (dirty pages on HVF and `emu`, write-protected pages on `emu`).

use std::sync::atomic::{AtomicU64, Ordering};

/// A bitmap of guest RAM pages ([`crate::arch::layout::PAGE_SIZE`], 16 KiB; indices from the start
/// of RAM), set and cleared from any vCPU thread without locks. Indices at or
/// past [`PageBitmap::pages`] are ignored.
#[derive(Debug)]
pub struct PageBitmap {
    words: Box<[AtomicU64]>,
    pages: u64,
}

impl PageBitmap {
    /// A clear bitmap for `pages` pages.
    pub fn new(pages: u64) -> Self {
        let words = pages.div_ceil(64);
        PageBitmap {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            pages,
        }
    }

    /// Number of pages covered.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The word holding `page`, if `page` is in range.
    fn word(&self, page: u64) -> Option<&AtomicU64> {
        if page < self.pages {
            self.words.get((page / 64) as usize)
        } else {
            None
        }
    }

    /// Marks page `page`.
    pub fn mark(&self, page: u64) {
        if let Some(w) = self.word(page) {
            w.fetch_or(1 << (page % 64), Ordering::AcqRel);
        }
    }

    /// Unmarks page `page`.
    pub fn unmark(&self, page: u64) {
        if let Some(w) = self.word(page) {
            w.fetch_and(!(1 << (page % 64)), Ordering::AcqRel);
        }
    }

    /// Whether page `page` is marked.
    pub fn is_marked(&self, page: u64) -> bool {
        self.word(page)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page % 64)) != 0)
    }

    /// Marks (`value` true) or unmarks pages `[first, end)`, a word at a time.
    pub fn fill(&self, first: u64, end: u64, value: bool) {
        let end = end.min(self.pages);
        let mut p = first;
        while p < end {
            let bit = p % 64;
            let n = (64 - bit).min(end - p);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            let w = &self.words[(p / 64) as usize];
            if value {
                w.fetch_or(mask, Ordering::AcqRel);
            } else {
                w.fetch_and(!mask, Ordering::AcqRel);
            }
            p += n;
        }
    }

    /// The marked page indices, ascending, without clearing them.
    pub fn marked(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, word) in self.words.iter().enumerate() {
            let mut bits = word.load(Ordering::Acquire);
            while bits != 0 {
                out.push(i as u64 * 64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
        out
    }

    /// Unmarks every page.
    pub fn clear(&self) {
        for word in self.words.iter() {
            word.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn dirty_pages_mark_peek_clear_and_bounds() {
        let d = PageBitmap::new(130);
        assert_eq!(d.pages(), 130);
        for p in [129, 0, 64, 63, 64, 500] {
            d.mark(p);
        }
        assert!(d.is_marked(63) && !d.is_marked(62) && !d.is_marked(500));
        assert_eq!(d.marked(), [0, 63, 64, 129]);
        // Peeking does not clear: a failed snapshot loses nothing.
        assert_eq!(d.marked(), [0, 63, 64, 129]);
        d.mark(7);
        d.clear();
        assert!(d.marked().is_empty());
        assert!(PageBitmap::new(0).marked().is_empty());
    }

    #[test]
    fn dirty_pages_from_many_threads() {
        let d = Arc::new(PageBitmap::new(4096));
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for p in (t..4096).step_by(4) {
                        d.mark(p);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(d.marked(), (0..4096).collect::<Vec<_>>());
    }

    #[test]
    fn fill_and_unmark_across_words_and_past_the_end() {
        let b = PageBitmap::new(200);
        b.fill(60, 130, true);
        assert_eq!(b.marked(), (60..130).collect::<Vec<_>>());
        b.fill(0, 1000, true);
        assert_eq!(b.marked(), (0..200).collect::<Vec<_>>());
        b.fill(1, 199, false);
        assert_eq!(b.marked(), [0, 199]);
        b.unmark(0);
        b.unmark(500);
        assert!(!b.is_marked(0) && b.is_marked(199));
        b.fill(0, 64, true);
        assert_eq!(b.marked().len(), 65);
    }
}
