//! Detection of a guest spinning on WFE or YIELD.
//!
//! Unicorn treats WFE and YIELD as yields with no hook, so a vCPU waiting in
//! a WFE loop (Linux spinlocks, `smp_cond_load_acquire`) or a YIELD loop
//! (`cpu_relax`, e.g. in `stop_machine`) would spin until its time slice
//! ends while the vCPU it waits for cannot run (one host thread, round
//! robin). The block hook feeds every block here; when the guest has been
//! cycling through the same few blocks for a while, the backend scans those
//! blocks for a WFE or YIELD and, if there is one, returns
//! [`crate::hv::VcpuExit::Wfe`] so the run loop can run another vCPU. Only
//! used when the VM has more than one vCPU (it costs a counter update per
//! block).

/// Only every `SAMPLE`-th block is recorded, to keep the per-block cost to a
/// counter increment. A prime larger than [`HISTORY`], so that the samples of
/// a cycle of at most `HISTORY` blocks cover every block of the cycle.
const SAMPLE: u32 = 61;

/// Sampled blocks a short cycle must run before its blocks are scanned for
/// WFE/YIELD (16 Ki blocks: a fraction of a millisecond of guest time).
const SPIN_SAMPLES: u32 = 256;

/// Number of distinct blocks that make up a "short cycle".
const HISTORY: usize = 16;

/// Recent (sampled) blocks and how long the guest has stayed among them.
#[derive(Clone, Debug, Default)]
pub struct SpinDetector {
    countdown: u32,
    addrs: [u64; HISTORY],
    sizes: [u32; HISTORY],
    next: usize,
    repeats: u32,
}

impl SpinDetector {
    /// Records the start of a block at `addr` of `size` bytes; `true` when
    /// the recent blocks should be scanned (see [`SpinDetector::blocks`]).
    #[inline(always)]
    pub fn on_block(&mut self, addr: u64, size: u32) -> bool {
        if self.countdown > 0 {
            self.countdown -= 1;
            return false;
        }
        self.countdown = SAMPLE - 1;
        self.sample(addr, size)
    }

    #[inline(never)]
    fn sample(&mut self, addr: u64, size: u32) -> bool {
        if let Some(i) = self.addrs.iter().position(|&a| a == addr) {
            self.sizes[i] = size;
            self.repeats += 1;
            if self.repeats >= SPIN_SAMPLES {
                self.repeats = 0;
                return true;
            }
        } else {
            self.addrs[self.next] = addr;
            self.sizes[self.next] = size;
            self.next = (self.next + 1) % HISTORY;
            self.repeats = 0;
        }
        false
    }

    /// The recent blocks as (virtual address, size in bytes).
    pub fn blocks(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.addrs
            .iter()
            .zip(self.sizes.iter())
            .filter(|(_, &s)| s != 0)
            .map(|(&a, &s)| (a, s))
    }

    /// Forgets the history (after the vCPU left the cycle).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_cycle_triggers_a_scan_and_new_code_resets() {
        let mut d = SpinDetector::default();
        let cycle = [0x1000, 0x1010, 0x1020];
        let mut fired = 0;
        // Enough blocks for the history to fill and then SPIN_SAMPLES hits.
        let blocks = (SAMPLE * (SPIN_SAMPLES + 3)) as usize;
        for i in 0..blocks {
            if d.on_block(cycle[i % 3], 16) {
                fired += 1;
            }
        }
        assert_eq!(fired, 1);
        assert_eq!(d.blocks().count(), 3);
        // Every block of a 2-block cycle is sampled.
        let mut d = SpinDetector::default();
        let fired = (0..blocks).filter(|&i| d.on_block(cycle[i % 2], 4)).count();
        assert_eq!(fired, 1);
        assert_eq!(d.blocks().count(), 2);
        // Straight-line code never repeats an address.
        let mut d = SpinDetector::default();
        assert!((0..100_000u64).all(|i| !d.on_block(0x10_0000 + 16 * i, 16)));
        // A long loop body (more blocks than the history) never fires.
        let mut d = SpinDetector::default();
        let n = HISTORY as u64 + 1;
        assert!((0..100_000u64).all(|i| !d.on_block(0x2000 + 16 * (i % n), 16)));
    }
}
