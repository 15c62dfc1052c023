//! Attention requests between threads: the bits another thread, another
//! vCPU or a hook sets on a vCPU ([`VcpuShared`]), acted on by the vCPU at
//! its next block boundary (the block hook stops the engine) or run entry.
//!
//! The same word also holds the vCPU's own per-block work (software step,
//! a watched page let through): the block hook, which runs before every
//! translated block, tests the whole word at once and leaves its fast path
//! only when it is non-zero (quirk 9 makes that hook the only safe place to
//! stop, so it must stay as cheap as a load and a branch).

use crate::sync::Locked;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

/// A [`Kick`](crate::hv::Kick): `run` returns
/// [`VcpuExit::Kicked`](crate::hv::VcpuExit::Kicked).
pub(super) const ATTN_KICK: u32 = 1 << 0;
/// The virtual timer deadline passed.
pub(super) const ATTN_TIMER: u32 = 1 << 1;
/// Flush the TLB (remote TLBI, protection change).
pub(super) const ATTN_TLB: u32 = 1 << 2;
/// Flush all translated blocks (IC IALLU/IALLUIS, or an overflowing IC queue).
pub(super) const ATTN_TB: u32 = 1 << 3;
/// Drop the translated blocks of the queued code pages (IC IVAU).
pub(super) const ATTN_IC: u32 = 1 << 4;
/// Read the watchpoint registers again and re-protect their pages (quirk
/// 16).
pub(super) const ATTN_WATCH: u32 = 1 << 6;
/// Re-evaluate the IRQ line (it may have risen, in a hook of this vCPU or
/// on another thread) and return to unicorn's main loop to take it.
pub(super) const ATTN_IRQ: u32 = 1 << 5;
/// The requests above: the block hook stops the engine for them, and `run`
/// takes them ([`VcpuShared::take_requests`]).
pub(super) const ATTN_REQUESTS: u32 = (1 << 7) - 1;

/// Per-block work, set and cleared by the vCPU's own thread and never taken
/// by `run`: while MDSCR_EL1.SS is set, the block hook checks the step state
/// (quirk 17).
pub(super) const ATTN_STEP: u32 = 1 << 8;
/// Per-block work: a watched page was let through for one access; the next
/// block protects it again (quirk 16).
pub(super) const ATTN_WATCH_BYPASS: u32 = 1 << 9;

/// Most code pages queued for one vCPU before a full TB flush is used instead.
const IC_QUEUE_MAX: usize = 64;

/// State of one vCPU shared with other threads and vCPUs.
pub(crate) struct VcpuShared {
    pub(super) attention: AtomicU32,
    pub(super) ic_pages: Mutex<Vec<u64>>,
    pub(super) created: AtomicBool,
}

impl VcpuShared {
    pub(super) fn new() -> Self {
        VcpuShared {
            attention: AtomicU32::new(0),
            ic_pages: Mutex::new(Vec::new()),
            created: AtomicBool::new(false),
        }
    }

    /// Sets attention bits.
    pub(crate) fn request(&self, bits: u32) {
        self.attention.fetch_or(bits, Ordering::Release);
    }

    /// Clears attention bits (the vCPU's own per-block work).
    pub(crate) fn clear(&self, bits: u32) {
        self.attention.fetch_and(!bits, Ordering::Release);
    }

    /// Sets or clears per-block work bits.
    pub(crate) fn set_work(&self, bits: u32, on: bool) {
        if on {
            self.request(bits);
        } else {
            self.clear(bits);
        }
    }

    /// The word as the block hook reads it: non-zero when a request or
    /// per-block work is pending.
    #[inline(always)]
    pub(crate) fn word(&self) -> u32 {
        self.attention.load(Ordering::Relaxed)
    }

    /// Takes the requests ([`ATTN_REQUESTS`]), leaving per-block work set.
    pub(crate) fn take_requests(&self) -> u32 {
        self.attention.fetch_and(!ATTN_REQUESTS, Ordering::AcqRel) & ATTN_REQUESTS
    }

    pub(crate) fn is_created(&self) -> bool {
        self.created.load(Ordering::Acquire)
    }

    /// Queues a 16 KiB code page (physical address) for invalidation.
    pub(crate) fn queue_ic(&self, page: u64) {
        let mut q = self.ic_pages.locked();
        if q.last() == Some(&page) {
            return;
        }
        if q.len() >= IC_QUEUE_MAX {
            q.clear();
            drop(q);
            self.request(ATTN_TB);
            return;
        }
        q.push(page);
        drop(q);
        self.request(ATTN_IC);
    }
}
