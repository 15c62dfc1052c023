use super::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicBool;
use vm_memory::{Bytes, GuestAddress};

const PS: usize = PAGE_SIZE as usize;

/// RAM of `pages` pages, page `p` filled with byte `p + 1`.
fn ram(pages: u64) -> Arc<GuestRam> {
    let ram = Arc::new(GuestRam::new_anonymous(pages * PAGE_SIZE).unwrap());
    for p in 0..pages {
        ram.memory()
            .write_slice(
                &vec![p as u8 + 1; PS],
                GuestAddress(ram.base() + p * PAGE_SIZE),
            )
            .unwrap();
    }
    ram
}

fn page_of(file: &File, offset: u64) -> Vec<u8> {
    let mut v = vec![0; PS];
    file.read_exact_at(&mut v, offset).unwrap();
    v
}

/// A byte of host RAM, written as a VMM thread would (no vm-memory
/// bitmap, a plain store through the mapping).
fn poke(ram: &GuestRam, page: u64, value: u8) {
    // SAFETY: in bounds of the live mapping; the test owns the RAM.
    unsafe {
        ram.host_ptr()
            .add((page * PAGE_SIZE) as usize + 100)
            .write_volatile(value)
    };
}

#[test]
fn the_file_holds_the_pages_as_they_were_at_the_start() {
    let ram = ram(16);
    let file = tempfile::tempfile().unwrap();
    file.set_len(16 * PAGE_SIZE).unwrap();
    let save = PageSave::start(
        &ram,
        vec![1, 2, 3, 9],
        file.try_clone().unwrap(),
        Slots::Image,
    )
    .unwrap();
    save.protect();
    // A VMM thread writes pending pages (faults, saved first), a page
    // outside the set (no fault), and a vCPU's write is announced.
    poke(&ram, 2, 0xee);
    poke(&ram, 5, 0xee);
    ram.before_guest_write(9);
    poke(&ram, 9, 0xdd);
    let counts = save.run().unwrap();
    assert_eq!(
        counts,
        SaveCounts {
            writer: 2,
            guest: 1,
            vmm: 1
        }
    );
    for p in [1u64, 2, 3, 9] {
        assert_eq!(
            page_of(&file, p * PAGE_SIZE),
            vec![p as u8 + 1; PS],
            "page {p}"
        );
    }
    // Nothing else was written, and every page is writable again.
    assert_eq!(page_of(&file, 5 * PAGE_SIZE), vec![0; PS]);
    for p in 0..16 {
        poke(&ram, p, 0x11);
    }
}

#[test]
fn zero_pages_stay_holes_in_both_layouts() {
    use std::os::unix::fs::MetadataExt;
    for (slots, base) in [
        (Slots::Image, 0),
        (
            Slots::Packed {
                data_offset: PAGE_SIZE,
            },
            PAGE_SIZE,
        ),
    ] {
        let ram = Arc::new(GuestRam::new_anonymous(64 * PAGE_SIZE).unwrap());
        poke(&ram, 3, 9);
        let file = tempfile::tempfile().unwrap();
        file.set_len(base + 64 * PAGE_SIZE).unwrap();
        let pages: Vec<u64> = (0..64).collect();
        let save = PageSave::start(&ram, pages, file.try_clone().unwrap(), slots).unwrap();
        save.protect();
        save.run().unwrap();
        let mut expect = vec![0; PS];
        expect[100] = 9;
        assert_eq!(page_of(&file, base + 3 * PAGE_SIZE), expect);
        assert_eq!(page_of(&file, base + 4 * PAGE_SIZE), vec![0; PS]);
        // One page's data (file systems without holes would hold all 64).
        let bytes = file.metadata().unwrap().blocks() * 512;
        assert!(bytes <= 4 * PAGE_SIZE, "{slots:?}: {bytes} bytes allocated");
    }
}

#[test]
fn packed_slots_follow_the_set_order() {
    let ram = ram(8);
    let file = tempfile::tempfile().unwrap();
    let save = PageSave::start(
        &ram,
        vec![2, 6],
        file.try_clone().unwrap(),
        Slots::Packed { data_offset: 512 },
    )
    .unwrap();
    save.protect();
    poke(&ram, 6, 0);
    save.run().unwrap();
    assert_eq!(page_of(&file, 512), vec![3; PS]);
    assert_eq!(page_of(&file, 512 + PAGE_SIZE), vec![7; PS]);
}

#[test]
fn writers_on_other_threads_race_the_save_and_never_tear_a_page() {
    let ram = ram(64);
    let file = tempfile::tempfile().unwrap();
    file.set_len(64 * PAGE_SIZE).unwrap();
    let pages: Vec<u64> = (0..64).collect();
    let save = PageSave::start(&ram, pages, file.try_clone().unwrap(), Slots::Image).unwrap();
    save.protect();
    std::thread::scope(|s| {
        for t in 0..2u8 {
            let ram = ram.clone();
            s.spawn(move || {
                for p in (0..64).rev() {
                    poke(&ram, p, 0x80 | t);
                }
            });
        }
        save.run().unwrap();
    });
    for p in 0..64u64 {
        assert_eq!(
            page_of(&file, p * PAGE_SIZE),
            vec![p as u8 + 1; PS],
            "page {p}"
        );
    }
    let c = save.counts();
    assert_eq!(c.writer + c.guest + c.vmm, 64);
}

#[test]
fn a_failing_file_reports_the_error_and_unprotects_everything() {
    let ram = ram(4);
    // A read-only file: every pwrite fails.
    let path = tempfile::NamedTempFile::new().unwrap();
    let file = File::open(path.path()).unwrap();
    let save = PageSave::start(&ram, vec![0, 1, 2, 3], file, Slots::Image).unwrap();
    save.protect();
    assert!(matches!(save.run(), Err(SaveError::Write(_))));
    for p in 0..4 {
        poke(&ram, p, 1);
    }
}

#[test]
fn bad_page_lists_are_refused_before_anything_is_protected() {
    let ram = ram(4);
    let file = tempfile::tempfile().unwrap();
    for pages in [vec![1, 1], vec![2, 1], vec![4]] {
        let e = PageSave::start(&ram, pages, file.try_clone().unwrap(), Slots::Image);
        assert!(matches!(e, Err(SaveError::BadPage { .. })));
    }
    poke(&ram, 1, 0);
}

/// Whether the host mapping at `addr` is writable (/proc/self/maps).
#[cfg(target_os = "linux")]
fn writable(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let (range, rest) = line.split_once(' ').unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        if (a..b).contains(&addr) {
            return rest.as_bytes()[1] == b'w';
        }
    }
    panic!("{addr:#x} is not mapped");
}

#[cfg(target_os = "linux")]
#[test]
fn protect_covers_only_pages_still_pending() {
    let ram = ram(8);
    let file = tempfile::tempfile().unwrap();
    file.set_len(8 * PAGE_SIZE).unwrap();
    let save =
        PageSave::start(&ram, vec![1, 2, 3], file.try_clone().unwrap(), Slots::Image).unwrap();
    let addr = |p: u64| ram.host_ptr() as usize + (p * PAGE_SIZE) as usize;
    // A vCPU writes page 2 after the guest resumed, before protect.
    ram.before_guest_write(2);
    assert!((1..4).all(|p| writable(addr(p))));
    save.protect();
    assert!(!writable(addr(1)) && writable(addr(2)) && !writable(addr(3)));
    assert!(writable(addr(4)));
    // A page saved by another thread while protected again is made
    // writable by the next fault on it.
    let again = addr(2);
    // SAFETY: a page of the live test mapping; only its protection
    // changes.
    let r = unsafe { libc::mprotect(again as *mut libc::c_void, PS, libc::PROT_READ) };
    assert_eq!(r, 0);
    poke(&ram, 2, 0x55);
    assert!(writable(again));
    save.run().unwrap();
    assert_eq!(page_of(&file, 2 * PAGE_SIZE), vec![3; PS]);
    assert!((0..8).all(|p| writable(addr(p))));
}

/// A kick that is already set: a wait for another thread's save ends at
/// once, so `before_guest_write_unless_kicked` answers whether the page
/// could be written without waiting.
fn kicked() -> AtomicBool {
    AtomicBool::new(true)
}

#[cfg(target_os = "linux")]
#[test]
fn a_page_being_saved_while_protect_runs_is_never_made_read_only() {
    use std::sync::{mpsc, Mutex};
    let ram = ram(8);
    let file = tempfile::tempfile().unwrap();
    file.set_len(8 * PAGE_SIZE).unwrap();
    let save =
        PageSave::start(&ram, vec![1, 2, 3], file.try_clone().unwrap(), Slots::Image).unwrap();
    let addr = |p: u64| ram.host_ptr() as usize + (p * PAGE_SIZE) as usize;
    // A vCPU's save of page 2 is held inside its write until released.
    let (release, held) = mpsc::channel::<()>();
    let (started, writing) = mpsc::channel::<usize>();
    let held = Mutex::new(held);
    save.hooks
        .before_write
        .set(Box::new(move |i| {
            let _ = started.send(i);
            let _ = held.lock().unwrap().recv();
        }))
        .ok()
        .unwrap();
    // While protect holds its claim on a run, a save of one of its pages
    // cannot complete without waiting (it is kicked, so it says so).
    let saw = Arc::new(Mutex::new(Vec::new()));
    let (r, pages, seen) = (ram.clone(), save.pages().to_vec(), saw.clone());
    save.hooks
        .protected
        .set(Box::new(move |first, n| {
            let k = kicked();
            let waits: Vec<bool> = (first..first + n)
                .map(|i| {
                    !r.before_guest_write_unless_kicked(pages[i], &|| k.load(Ordering::Acquire))
                })
                .collect();
            seen.lock().unwrap().push((first, n, waits));
        }))
        .ok()
        .unwrap();
    std::thread::scope(|s| {
        let vcpu = s.spawn(|| ram.before_guest_write(2));
        assert_eq!(writing.recv().unwrap(), 1, "page 2 is index 1 in the set");
        save.protect();
        // Page 2, being saved, was skipped: protect claimed 1 and 3 alone.
        assert_eq!(
            *saw.lock().unwrap(),
            [(0, 1, vec![true]), (2, 1, vec![true])]
        );
        assert!(!writable(addr(1)) && writable(addr(2)) && !writable(addr(3)));
        release.send(()).unwrap();
        vcpu.join().unwrap();
    });
    assert!(writable(addr(2)));
    drop(release);
    save.run().unwrap();
    assert_eq!(page_of(&file, 2 * PAGE_SIZE), vec![3; PS]);
    assert_eq!(save.counts().guest, 1);
    assert!((0..8).all(|p| writable(addr(p))));
}

#[test]
fn the_writer_marks_each_page_saved_as_soon_as_it_is_written() {
    use std::sync::Mutex;
    let ram = ram(8);
    let file = tempfile::tempfile().unwrap();
    file.set_len(8 * PAGE_SIZE).unwrap();
    let pages: Vec<u64> = (0..8).collect();
    let save = PageSave::start(&ram, pages, file.try_clone().unwrap(), Slots::Image).unwrap();
    save.protect();
    // The writer takes all 8 pages as one batch. When it is about to write
    // page 5, pages 0-4 are saved: a vCPU writes page 4 without waiting (a
    // wait would end at once, the kick being set), while page 6, claimed by
    // the batch and not written yet, would need a wait.
    let checked = Arc::new(Mutex::new(None));
    let (r, out) = (ram.clone(), checked.clone());
    save.hooks
        .before_write
        .set(Box::new(move |i| {
            if i == 5 {
                let k = kicked();
                let four = r.before_guest_write_unless_kicked(4, &|| k.load(Ordering::Acquire));
                if four {
                    poke(&r, 4, 0xee);
                }
                let six = r.before_guest_write_unless_kicked(6, &|| k.load(Ordering::Acquire));
                *out.lock().unwrap() = Some((four, six));
            }
        }))
        .ok()
        .unwrap();
    save.run().unwrap();
    assert_eq!(*checked.lock().unwrap(), Some((true, false)));
    for p in 0..8u64 {
        assert_eq!(
            page_of(&file, p * PAGE_SIZE),
            vec![p as u8 + 1; PS],
            "page {p}"
        );
    }
    assert_eq!(save.counts().writer, 8);
    for p in 0..8 {
        poke(&ram, p, 1);
    }
}

#[test]
fn a_kick_ends_a_wait_for_a_page_another_thread_is_saving() {
    let ram = ram(4);
    let file = tempfile::tempfile().unwrap();
    file.set_len(4 * PAGE_SIZE).unwrap();
    let save = PageSave::start(
        &ram,
        vec![0, 1, 2, 3],
        file.try_clone().unwrap(),
        Slots::Image,
    )
    .unwrap();
    save.protect();
    // The writer is held inside its write of page 2 until released.
    let HeldWriter { writing, release } = save.hold_writer_at(2);
    let kick = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| save.run());
        writing.recv().unwrap();
        // A vCPU faults on page 2 and waits for the writer; a kick (a pause
        // or a quit asking for the vCPU) ends the wait with the page
        // neither saved by it nor writable. The writer cannot finish page 2
        // before the vCPU's answer: it is held until after the join.
        let vcpu =
            s.spawn(|| ram.before_guest_write_unless_kicked(2, &|| kick.load(Ordering::Acquire)));
        kick.store(true, Ordering::Release);
        assert!(!vcpu.join().unwrap());
        release.send(()).unwrap();
        writer.join().unwrap().unwrap();
    });
    // Once the page is saved, the retried write goes on.
    assert!(ram.before_guest_write_unless_kicked(2, &|| kick.load(Ordering::Acquire)));
    poke(&ram, 2, 9);
    assert_eq!(page_of(&file, 2 * PAGE_SIZE), vec![3; PS]);
    assert_eq!(save.counts().writer, 4);
}
