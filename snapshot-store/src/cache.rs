//! The verified-file cache (`verified.json`, whose layout is
//! `format::verified`): per layer, each file's identity stamp at the time
//! its sha256 was last verified, so that a later verification can skip
//! re-hashing files that have not changed since. This module decides when
//! a stamp may be recorded and when an entry may be trusted, and reads and
//! writes the file.
//!
//! The cache is a hint, never a source of truth: it is read with a bounded
//! read, any problem with it means "no cache", and an entry is used only if
//! the file's current stamp equals the recorded one exactly *and* the
//! recorded sha256 equals the manifest's. It is not part of the layer (no
//! manifest lists it) and is the one file in a layer directory that is
//! rewritten (atomically) after commit.
//!
//! Why a stamp is evidence that a file is unchanged: every write to a file
//! through the file system (`write`, `truncate`, `fallocate`, a writable
//! mapping, a clone onto it, a rename over it, `chmod`) updates its ctime,
//! and no system call lets an unprivileged process set ctime. A stamp
//! (device, inode, size, mtime, ctime, all in nanoseconds) therefore
//! changes with any modification, unless that modification happens within
//! the file system's timestamp granularity of the last change (the "racy"
//! case). To exclude that case a stamp is only recorded if the file's ctime
//! is older, by a safety window, than a clock reading taken *before* the
//! stamp was taken (see [`settled`]): any later change then gets a strictly
//! newer ctime.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{Error, IoContext, Result};
use crate::format::verified::{
    encode, parse, CacheEntry, Entries, Stamp, MAX_VERIFIED_BYTES, VERIFIED_FILE,
    VERIFIED_TMP_PREFIX,
};
use crate::fsutil::{is_not_found, nonce, open_regular, Links};

/// A ctime must be at least this much older than the clock reading taken
/// before the stamp (nanoseconds) for the stamp to be recorded, on file
/// systems with sub-10-ms timestamps. Covers the Linux coarse clock (one
/// tick, at most 10 ms) and the file system's granularity, with margin.
pub(crate) const RACY_WINDOW_NS: i128 = 50_000_000;
/// The same for file systems whose timestamps look coarse (a ctime that is
/// a multiple of 10 ms: HFS+ and ext4 with small inodes keep whole
/// seconds, FAT two seconds).
pub(crate) const COARSE_RACY_WINDOW_NS: i128 = 2_100_000_000;

/// The clock the racy-window decisions read and commit's wait sleeps on:
/// [`SystemClock`], or a test's, so that the decisions are tested without
/// depending on timing.
pub(crate) trait Clock: Sync {
    /// Wall-clock time in nanoseconds since the epoch (negative before it),
    /// on the clock file times are taken from.
    fn now_ns(&self) -> i128;
    /// Sleep at least `ns` nanoseconds.
    fn sleep_ns(&self, ns: u64);
}

/// The system's wall clock (`CLOCK_REALTIME`, which file times follow).
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i128 {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        }
    }

    fn sleep_ns(&self, ns: u64) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
}

/// The racy window that applies to `stamp` (see [`settled`]).
fn window(stamp: &Stamp) -> i128 {
    if stamp.ctime_ns.rem_euclid(10_000_000) == 0 {
        COARSE_RACY_WINDOW_NS
    } else {
        RACY_WINDOW_NS
    }
}

/// `true` if `stamp`, taken after the clock read `t0_ns`, may be recorded:
/// its ctime is older than `t0_ns` by the racy window, so any change made
/// after the stamp was taken gets a different ctime. A ctime in the future
/// (clock skew, a clock stepped back) is never settled.
pub(crate) fn settled(stamp: &Stamp, t0_ns: i128) -> bool {
    stamp.ctime_ns <= t0_ns - window(stamp)
}

/// Nanoseconds to wait from `now_ns` until `stamp` would be settled.
pub(crate) fn until_settled(stamp: &Stamp, now_ns: i128) -> i128 {
    (stamp.ctime_ns + window(stamp) - now_ns).max(0)
}

/// The stamp a verification may record for a file it hashed: `before`, its
/// stamp when opened after the clock read `t0_ns`, if it still had that
/// stamp after hashing (`after`) and is settled relative to `t0_ns`.
pub(crate) fn recordable(before: Stamp, after: Stamp, t0_ns: i128) -> Option<Stamp> {
    (before == after && settled(&before, t0_ns)).then_some(before)
}

/// Read `dir/verified.json`. Never fails: a missing cache is empty, and an
/// unreadable, oversized or malformed one is empty too, with a note saying
/// why (for the verification report and the log).
pub(crate) fn load(dir: &Path) -> (Entries, Option<String>) {
    let path = dir.join(VERIFIED_FILE);
    match read_cache(&path) {
        Ok(Some(e)) => (e, None),
        Ok(None) => (Entries::new(), None),
        Err(why) => {
            let note = format!("{}: ignored ({why}); files are hashed", path.display());
            tracing::debug!("{note}");
            (Entries::new(), Some(note))
        }
    }
}

fn read_cache(path: &Path) -> std::result::Result<Option<Entries>, String> {
    let f = match open_regular(path, Links::Refuse) {
        Ok(f) => f,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(Error::Corrupt { msg, .. }) => return Err(msg),
        Err(e) => return Err(e.io_error().map_or(e.to_string(), |e| format!("open: {e}"))),
    };
    let fmeta = f.metadata().map_err(|e| format!("stat: {e}"))?;
    if fmeta.len() > MAX_VERIFIED_BYTES {
        return Err(format!(
            "{} bytes, larger than the {MAX_VERIFIED_BYTES}-byte limit",
            fmeta.len()
        ));
    }
    // Sized from the stat (bounded), so the file is read in one call.
    let mut bytes = Vec::with_capacity(fmeta.len().min(MAX_VERIFIED_BYTES) as usize + 1);
    f.take(MAX_VERIFIED_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("read: {e}"))?;
    if bytes.len() as u64 > MAX_VERIFIED_BYTES {
        return Err(format!("larger than the {MAX_VERIFIED_BYTES}-byte limit"));
    }
    parse(&bytes).map(Some).map_err(|e| e.0)
}

/// `true` if `entries` vouches for `file`: an entry whose stamp equals
/// `current` and whose sha256 equals `expect` (the manifest's).
pub(crate) fn vouches(entries: &Entries, file: &str, current: &Stamp, expect: &str) -> bool {
    entries
        .get(file)
        .is_some_and(|e| e.stamp() == *current && e.sha256() == expect)
}

/// Write `entries` as `dir/verified.json`, atomically: a new file
/// `.verified.json.tmp-PID-NONCE` (mode 0644), written and fsynced, then
/// renamed over `verified.json`, so that `verified.json` is always either
/// the old or the new cache, never a torn one.
///
/// `dir` itself is not fsynced here: if a crash loses the rename, the old
/// cache is still there, and every entry of an old cache is still true
/// (it vouches only for a file whose stamp is unchanged since). Commit
/// writes the cache into the work directory, which it fsyncs anyway.
pub(crate) fn write_entries(dir: &Path, entries: &Entries) -> Result<()> {
    let bytes = encode(entries);
    let tmp = dir.join(format!(
        "{VERIFIED_TMP_PREFIX}{}-{:016x}",
        std::process::id(),
        nonce()
    ));
    let dst = dir.join(VERIFIED_FILE);
    let r = (|| {
        let mut f: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .ctx(&tmp, "create")?;
        f.write_all(&bytes).ctx(&tmp, "write")?;
        f.sync_all().ctx(&tmp, "fsync")?;
        drop(f);
        std::fs::rename(&tmp, &dst).ctx(&tmp, "rename into place")
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// If at least this many bytes of freshly written files have stamps that
/// are not settled yet, commit waits (at most [`RACY_WINDOW_NS`]) for them
/// to settle rather than leave them to be re-hashed at the first restore.
pub(crate) const COMMIT_WAIT_MIN_BYTES: u64 = 32 << 20;

/// How long commit sleeps before taking the stamps of its new files again,
/// given their `stamps` taken after the clock read `t0_ns`: if at least
/// `wait_min_bytes` of them (`None`: never wait) are not settled, and every
/// file settles within [`RACY_WINDOW_NS`], the time until the last one
/// settles plus 1 ms; otherwise `None` (no wait: the unsettled files are
/// left to the first verification).
pub(crate) fn commit_wait_ns(
    stamps: &[Stamp],
    t0_ns: i128,
    wait_min_bytes: Option<u64>,
) -> Option<u64> {
    let min = wait_min_bytes?.max(1);
    let racy: u64 = stamps
        .iter()
        .filter(|s| !settled(s, t0_ns))
        .map(|s| s.size)
        .sum();
    if racy < min {
        return None;
    }
    let wait = stamps
        .iter()
        .map(|s| until_settled(s, t0_ns))
        .max()
        .unwrap_or(0);
    // wait <= 50 ms: fits u64.
    (wait <= RACY_WINDOW_NS).then(|| wait as u64 + 1_000_000)
}

/// The entries commit records for `files` (`(file name, sha256 of the
/// bytes written)`): `stat_all` gives their stamps, in order; if
/// [`commit_wait_ns`] says so, it sleeps on `clock` and takes them again.
/// Only settled stamps are recorded.
fn entries_to_record(
    files: &[(&str, &str)],
    stat_all: impl Fn() -> Result<Vec<Stamp>>,
    wait_min_bytes: Option<u64>,
    clock: &dyn Clock,
) -> Result<Entries> {
    let mut t0 = clock.now_ns();
    let mut stamps = stat_all()?;
    if let Some(ns) = commit_wait_ns(&stamps, t0, wait_min_bytes) {
        clock.sleep_ns(ns);
        t0 = clock.now_ns();
        stamps = stat_all()?;
    }
    let mut entries = Entries::new();
    for ((f, sha), s) in files.iter().zip(&stamps) {
        if settled(s, t0) {
            entries.insert(f.to_string(), CacheEntry::new(*s, sha));
        }
    }
    Ok(entries)
}

/// At commit: record in `dir/verified.json` (`dir` is the work directory,
/// which the caller fsyncs) the stamps of the layer's `files`, given as
/// `(file name, sha256 of the bytes written)`. Files whose stamps are not
/// settled are left out (they are hashed by the first verification); if
/// they are large, it first waits up to the racy window for them to
/// settle, when at least `wait_min_bytes` of them are unsettled (`None`:
/// never wait; see [`commit_wait_ns`]). Always writes the file, possibly
/// with no entries. Returns the number of files recorded.
pub(crate) fn record_written(
    dir: &Path,
    files: &[(&str, &str)],
    wait_min_bytes: Option<u64>,
    clock: &dyn Clock,
) -> Result<usize> {
    let stat_all = || -> Result<Vec<Stamp>> {
        files
            .iter()
            .map(|(f, _)| {
                let p = dir.join(f);
                std::fs::symlink_metadata(&p)
                    .ctx(&p, "stat")
                    .map(|m| Stamp::of(&m))
            })
            .collect()
    };
    let entries = entries_to_record(files, stat_all, wait_min_bytes, clock)?;
    write_entries(dir, &entries)?;
    Ok(entries.len())
}

/// A clock for tests: reads `now`, and sleeping advances it (recorded in
/// `slept`) instead of waiting.
#[cfg(test)]
pub(crate) struct FakeClock {
    pub now: std::sync::Mutex<i128>,
    pub slept: std::sync::Mutex<Vec<u64>>,
}

#[cfg(test)]
impl FakeClock {
    pub(crate) fn at(now_ns: i128) -> FakeClock {
        FakeClock {
            now: std::sync::Mutex::new(now_ns),
            slept: std::sync::Mutex::new(Vec::new()),
        }
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now_ns(&self) -> i128 {
        *self.now.lock().unwrap()
    }

    fn sleep_ns(&self, ns: u64) {
        *self.now.lock().unwrap() += i128::from(ns);
        self.slept.lock().unwrap().push(ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{MEMORY_FILE, STATE_FILE};

    fn stamp(ctime_ns: i128) -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: ctime_ns,
            ctime_ns,
        }
    }

    #[test]
    fn settled_needs_the_window() {
        let c = 1_700_000_000_123_456_789;
        let s = stamp(c);
        assert!(!settled(&s, c));
        assert!(!settled(&s, c + RACY_WINDOW_NS - 1));
        assert!(settled(&s, c + RACY_WINDOW_NS));
        assert_eq!(until_settled(&s, c), RACY_WINDOW_NS);
        assert_eq!(until_settled(&s, c + 2 * RACY_WINDOW_NS), 0);
        // Whole-second (or 10 ms) ctimes: assume a coarse file system.
        let s = stamp(1_700_000_000_000_000_000);
        assert!(!settled(&s, s.ctime_ns + RACY_WINDOW_NS));
        assert!(settled(&s, s.ctime_ns + COARSE_RACY_WINDOW_NS));
        // A ctime in the future is never settled.
        assert!(!settled(&stamp(c), c - 1));
    }

    #[test]
    fn recordable_needs_an_unchanged_settled_stamp() {
        let c = 1_700_000_000_123_456_789;
        let s = stamp(c);
        assert_eq!(recordable(s, s, c + RACY_WINDOW_NS), Some(s));
        // Changed while it was hashed.
        let mut later = s;
        later.ctime_ns += 1;
        assert_eq!(recordable(s, later, c + RACY_WINDOW_NS), None);
        // Too fresh relative to the clock read before it was opened.
        assert_eq!(recordable(s, s, c + RACY_WINDOW_NS - 1), None);
        assert_eq!(recordable(s, s, c - 1), None);
    }

    fn sized(ctime_ns: i128, size: u64) -> Stamp {
        Stamp {
            size,
            ..stamp(ctime_ns)
        }
    }

    #[test]
    fn commit_waits_only_for_enough_unsettled_bytes_within_the_window() {
        let c = 1_700_000_000_123_456_789;
        let big = sized(c, 40 << 20);
        let small = sized(c + 5_000_000, 100);
        let min = Some(32 << 20);
        // All fresh: wait until the newest settles, plus 1 ms.
        assert_eq!(
            commit_wait_ns(&[big, small], c + 6_000_000, min),
            Some(50_000_000)
        );
        // One ctime ahead of the clock read (skew): it would take longer
        // than the window, so no wait.
        assert_eq!(commit_wait_ns(&[big, small], c + 1_000_000, min), None);
        // Never asked to wait, or too few unsettled bytes.
        assert_eq!(commit_wait_ns(&[big, small], c, None), None);
        assert_eq!(commit_wait_ns(&[small], c, min), None);
        assert_eq!(
            commit_wait_ns(&[small], c + 5_000_000, Some(0)),
            Some(51_000_000)
        );
        // Settled already: nothing to wait for.
        assert_eq!(commit_wait_ns(&[big, small], c + 60_000_000, min), None);
        assert_eq!(commit_wait_ns(&[], c, Some(0)), None);
        // A coarse (whole 10 ms) ctime needs 2.1 s: not worth waiting for.
        let coarse = sized(1_700_000_000_000_000_000, 40 << 20);
        assert_eq!(commit_wait_ns(&[coarse], coarse.ctime_ns, min), None);
        // A ctime ahead of the clock (skew) is not waited for either.
        assert_eq!(commit_wait_ns(&[big], c - 1_000_000_000, min), None);
    }

    #[test]
    fn commit_records_settled_stamps_after_its_wait() {
        use std::cell::Cell;
        let c = 1_700_000_000_123_456_789;
        let files = [(MEMORY_FILE, "aa"), (STATE_FILE, "bb")];
        let stamps = vec![sized(c, 40 << 20), sized(c + 1, 56)];
        let stats = Cell::new(0);
        let stat_all = || {
            stats.set(stats.get() + 1);
            Ok(stamps.clone())
        };
        // Fresh and large: one wait, then both are recorded.
        let clock = FakeClock::at(c + 2_000_000);
        let e = entries_to_record(&files, stat_all, Some(32 << 20), &clock).unwrap();
        assert_eq!(*clock.slept.lock().unwrap(), [49_000_001]);
        assert_eq!(stats.get(), 2);
        assert_eq!(e.len(), 2);
        assert_eq!(e[MEMORY_FILE], CacheEntry::new(stamps[0], "aa"));
        assert_eq!(e[STATE_FILE], CacheEntry::new(stamps[1], "bb"));
        // Fresh, not allowed to wait: nothing recorded, no second stat.
        stats.set(0);
        let clock = FakeClock::at(c + 2_000_000);
        let e = entries_to_record(&files, stat_all, None, &clock).unwrap();
        assert!(e.is_empty() && clock.slept.lock().unwrap().is_empty());
        assert_eq!(stats.get(), 1);
        // Only the older file has settled: it alone is recorded.
        let clock = FakeClock::at(c + RACY_WINDOW_NS);
        let e = entries_to_record(&files, stat_all, None, &clock).unwrap();
        assert_eq!(e.keys().collect::<Vec<_>>(), [MEMORY_FILE]);
        // A stamp that changes during the wait is recorded as it is after.
        let moved = Cell::new(false);
        let stat_all = || {
            let mut s = stamps.clone();
            if moved.replace(true) {
                s[1].ctime_ns += 10_000_001;
            }
            Ok(s)
        };
        let clock = FakeClock::at(c + 2_000_000);
        let e = entries_to_record(&files, stat_all, Some(0), &clock).unwrap();
        assert_eq!(e.keys().collect::<Vec<_>>(), [MEMORY_FILE]);
    }

    #[test]
    fn record_written_stats_the_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(MEMORY_FILE), b"memory").unwrap();
        std::fs::write(d.path().join(STATE_FILE), b"state").unwrap();
        let (aa, bb) = ("aa".repeat(32), "bb".repeat(32));
        let files = [(MEMORY_FILE, aa.as_str()), (STATE_FILE, bb.as_str())];
        let stamps: Vec<Stamp> = files
            .iter()
            .map(|(f, _)| Stamp::of(&std::fs::symlink_metadata(d.path().join(f)).unwrap()))
            .collect();
        let newest = stamps.iter().map(|s| s.ctime_ns).max().unwrap();
        // Long after the newest change (past even the coarse window).
        let clock = FakeClock::at(newest + 3_000_000_000);
        assert_eq!(record_written(d.path(), &files, None, &clock).unwrap(), 2);
        let (e, note) = load(d.path());
        assert!(note.is_none());
        assert!(vouches(&e, MEMORY_FILE, &stamps[0], &aa));
        assert!(vouches(&e, STATE_FILE, &stamps[1], &bb));
        // Right after it: nothing recorded, and the cache says so.
        let clock = FakeClock::at(newest);
        assert_eq!(record_written(d.path(), &files, None, &clock).unwrap(), 0);
        assert!(load(d.path()).0.is_empty());
        assert!(record_written(d.path(), &[("missing", &aa)], None, &clock).is_err());
    }

    #[test]
    fn round_trip_and_rejections() {
        let d = tempfile::tempdir().unwrap();
        let (e, note) = load(d.path());
        assert!(e.is_empty() && note.is_none());
        let mut entries = Entries::new();
        let s = Stamp {
            dev: u64::MAX,
            ino: 7,
            size: 1 << 40,
            mtime_ns: -5,
            ctime_ns: i128::from(i64::MAX) * 1_000_000_000 + 999_999_999,
        };
        entries.insert(MEMORY_FILE.into(), CacheEntry::new(s, &"ab".repeat(32)));
        write_entries(d.path(), &entries).unwrap();
        let (back, note) = load(d.path());
        assert_eq!(back, entries);
        assert!(note.is_none());
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [VERIFIED_FILE]);
        assert!(vouches(&back, MEMORY_FILE, &s, &"ab".repeat(32)));
        assert!(!vouches(&back, MEMORY_FILE, &s, &"cd".repeat(32)));
        assert!(!vouches(&back, STATE_FILE, &s, &"ab".repeat(32)));
        let mut other = s;
        other.ctime_ns += 1;
        assert!(!vouches(&back, MEMORY_FILE, &other, &"ab".repeat(32)));

        let good = std::fs::read_to_string(d.path().join(VERIFIED_FILE)).unwrap();
        for (bad, why) in [
            (String::new(), "malformed"),
            ("{".to_string(), "malformed"),
            (good.replace("\"format\": 1", "\"format\": 2"), "format 2"),
            (good.replace(MEMORY_FILE, "other.bin"), "unknown file"),
            (good.replace(&"ab".repeat(32), &"AB".repeat(32)), "hex"),
            (good.replace("\"ino\": 7", "\"ino\": -7"), "malformed"),
            (
                good.replace("\"size\"", "\"extra\": 1, \"size\""),
                "malformed",
            ),
            (
                good.replace(",\n      \"sha256\"", ", \"x\": 0,\n \"sha256\""),
                "malformed",
            ),
            (
                format!("{good}{}", " ".repeat(MAX_VERIFIED_BYTES as usize)),
                "limit",
            ),
        ] {
            std::fs::write(d.path().join(VERIFIED_FILE), &bad).unwrap();
            let (e, note) = load(d.path());
            assert!(e.is_empty(), "{why}");
            let note = note.unwrap();
            assert!(
                note.contains(VERIFIED_FILE) && note.contains(why),
                "{why}: {note}"
            );
        }
        std::fs::remove_file(d.path().join(VERIFIED_FILE)).unwrap();
        std::os::unix::fs::symlink("elsewhere", d.path().join(VERIFIED_FILE)).unwrap();
        let (e, note) = load(d.path());
        assert!(e.is_empty() && note.unwrap().contains("not a regular file"));
    }
}
