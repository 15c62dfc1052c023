//! Files that are not regular files in a store: a FIFO, a Unix socket, a
//! device node or a directory in the place of each file of a layer, and in
//! the place of a layer's directory. No entry point of the store (those
//! behind each `vmstore` subcommand and behind `boot --restore`) may hang
//! on one (each runs under a time guard, so a regression fails instead of
//! hanging the suite), and every one that reads the file refuses it with
//! an error naming the file and what it is: `manifest.json: not a regular
//! file (a FIFO)`.

mod common;

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use snapshot_store::format::verified::VERIFIED_FILE;
use snapshot_store::format::{
    DISK_CHUNKS_FILE, DISK_DIFF_FILE, DISK_FILE, LAYER_FILES, MANIFEST_FILE, MEMORY_FILE,
    STATE_FILE,
};
use snapshot_store::{
    map_chain_memory, verify_chain, verify_chain_cached, ChainDisk, DiskImage, DiskSource, Store,
    VerifyReport,
};

/// How long one entry point may take on a store of a few pages before it
/// counts as hung (it takes milliseconds).
const GUARD: Duration = Duration::from_secs(30);

/// What is put in a file's place.
#[derive(Clone, Copy, Debug)]
enum Special {
    Fifo,
    Socket,
    /// A character device node (`mknod`, as root), else a symbolic link to
    /// `/dev/zero`.
    Device,
    Directory,
}

const SPECIALS: [Special; 4] = [
    Special::Fifo,
    Special::Socket,
    Special::Device,
    Special::Directory,
];

/// Creates `kind` at `path`; returns what the store must call it.
fn make(kind: Special, path: &Path) -> &'static str {
    use nix::sys::stat::{mknod, Mode, SFlag};
    match kind {
        Special::Fifo => {
            nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o644)).unwrap();
            "a FIFO"
        }
        Special::Socket => {
            // The socket file stays when the listener is dropped.
            drop(UnixListener::bind(path).unwrap());
            "a socket"
        }
        Special::Device => {
            // Linux's /dev/zero: a device that reads forever.
            let dev = libc::makedev(1, 5);
            match mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o644), dev) {
                Ok(()) => "a character device",
                Err(_) => {
                    std::os::unix::fs::symlink("/dev/zero", path).unwrap();
                    "a symbolic link"
                }
            }
        }
        Special::Directory => {
            std::fs::create_dir(path).unwrap();
            "a directory"
        }
    }
}

/// `base` (full) <- `d1` (diff), each with state and a disk (d1's a disk
/// diff of chunk 0), and `other` (full, a chain of its own); every file
/// writable so it can be replaced.
fn fixture() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    disk_image(&disk, 3);
    let mut ram = vec![0u8; 4 * PS as usize];
    Rng(11).fill(&mut ram);
    let base = full(&store, "base", &ram, b"base state", Some(&disk));
    ram[PS as usize] ^= 0xff;
    let mut w = store.begin("d1", base.child_meta("test")).unwrap();
    w.write_diff_from_ram(&ram, [1]).unwrap();
    w.write_state(b"d1 state").unwrap();
    let src = std::sync::Arc::new(DiskImage::open(&disk).unwrap());
    w.begin_disk_diff(src, &[0]).unwrap();
    w.complete_disk().unwrap();
    w.commit().unwrap();
    full(&store, "other", &ram, b"other state", Some(&disk));
    make_writable(store.root());
    (dir, store)
}

/// Runs `op` on a thread; its outcome (`Err`: the error's text), or a
/// panic naming `what` if it takes longer than [`GUARD`].
fn guarded(
    what: &str,
    op: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(op());
    });
    match rx.recv_timeout(GUARD) {
        Ok(r) => r,
        Err(_) => panic!("{what}: hung (no answer within {GUARD:?})"),
    }
}

/// An entry point: its name, and a call of it on a store.
type EntryPoint = (&'static str, fn(&Store, &Path) -> Result<(), String>);

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A verification's first note on a verified-file cache it could not use
/// (not an error: the files are hashed instead), as an `Err`.
fn noted(r: VerifyReport) -> Result<(), String> {
    r.cache_notes.first().map_or(Ok(()), |n| Err(n.clone()))
}

/// Every entry point, in the order `vmstore` and `boot --restore` reach
/// them. `scratch` is a directory outside the store. An `Err` is the
/// error's text; a listing's unreadable row is an `Err` too.
const ENTRY_POINTS: [EntryPoint; 13] = [
    // vmstore list, vmstore tree.
    ("list", |s, _| {
        s.list()
            .map_err(err)?
            .into_iter()
            .try_for_each(|e| e.summary.map(drop).map_err(err))
    }),
    ("du", |s, _| {
        s.du()
            .map_err(err)?
            .into_iter()
            .try_for_each(|(_, u)| u.map(drop).map_err(err))
    }),
    // vmstore inspect d1: the layer, its chain, its children.
    ("inspect", |s, _| {
        s.layer("d1").map_err(err)?;
        s.resolve("d1").map_err(err)?;
        s.children("d1").map(drop).map_err(err)
    }),
    // vmstore inspect other: the children of a layer read every layer.
    ("inspect another layer", |s, _| {
        s.children("other").map(drop).map_err(err)
    }),
    ("verify", |s, _| {
        noted(verify_chain(&s.resolve("d1").map_err(err)?).map_err(err)?)
    }),
    ("verify --cached", |s, _| {
        noted(verify_chain_cached(&s.resolve("d1").map_err(err)?).map_err(err)?)
    }),
    ("verify --all", |s, _| {
        s.verify_all(None)
            .map_err(err)?
            .into_iter()
            .try_for_each(|(_, r)| noted(r.map_err(err)?))
    }),
    ("squash", |s, _| {
        s.squash("d1", "squashed", None).map(drop).map_err(err)
    }),
    ("gc", |s, _| s.gc().map(drop).map_err(err)),
    // boot --restore d1, step by step (the VMM maps memory and reads the
    // state while the chain is verified, and opens the chain's disk).
    ("restore: map memory", |s, _| {
        map_chain_memory(&s.resolve("d1").map_err(err)?)
            .map(drop)
            .map_err(err)
    }),
    ("restore: read state", |s, _| {
        let chain = s.resolve("d1").map_err(err)?;
        chain.top().read_state().map(drop).map_err(err)
    }),
    ("restore: open disk", |s, _| {
        let chain = s.resolve("d1").map_err(err)?;
        let disk = ChainDisk::open(&chain).map_err(err)?.ok_or("no disk")?;
        // Chunk 0 is d1's, the last one base's.
        let last = disk.size() - 1;
        disk.read_exact_at(&mut [0u8; 1], 0).map_err(err)?;
        disk.read_exact_at(&mut [0u8; 1], last).map_err(err)
    }),
    // Last: it removes `other` when it succeeds.
    ("remove another layer", |s, _| {
        s.remove("other", false).map(drop).map_err(err)
    }),
];

/// The entry points that read `file` of layer `layer` (so must refuse it).
fn readers_of(layer: &str, file: &str) -> Vec<&'static str> {
    let verify = ["verify", "verify --all", "squash"];
    match file {
        MANIFEST_FILE => ENTRY_POINTS
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n != "gc")
            .collect(),
        MEMORY_FILE => [&verify[..], &["verify --cached", "restore: map memory"]].concat(),
        STATE_FILE if layer == "d1" => {
            [&verify[..], &["verify --cached", "restore: read state"]].concat()
        }
        // d1's disk is a diff over base's image.
        DISK_FILE if layer == "base" => {
            [&verify[..], &["verify --cached", "restore: open disk"]].concat()
        }
        DISK_DIFF_FILE if layer == "d1" => {
            [&verify[..], &["verify --cached", "restore: open disk"]].concat()
        }
        // Not the layer's (its manifest lists the other): not read.
        DISK_FILE | DISK_DIFF_FILE => Vec::new(),
        STATE_FILE | DISK_CHUNKS_FILE => [&verify[..], &["verify --cached"]].concat(),
        // The cache is a hint: a verification hashes instead, says why in
        // a note, and writes a new cache in its place.
        VERIFIED_FILE => [&verify[..2], &["verify --cached"]].concat(),
        _ => unreachable!("{file}"),
    }
}

/// Replaces `layer`'s `file` by each special file in turn and runs every
/// entry point on the store.
fn check_position(layer: &str, file: &str) {
    for kind in SPECIALS {
        let (dir, store) = fixture();
        let path = store.root().join(layer).join(file);
        let _ = std::fs::remove_file(&path);
        let called = make(kind, &path);
        let made = std::fs::symlink_metadata(&path).unwrap().file_type();
        let want = if file == VERIFIED_FILE {
            format!("{file}: ignored (not a regular file ({called}))")
        } else {
            format!("{file}: not a regular file ({called})")
        };
        let must_refuse = readers_of(layer, file);
        let scratch = dir.path().to_path_buf();
        for (name, op) in ENTRY_POINTS {
            // A verification replaces a cache it cannot use: put it back.
            if std::fs::symlink_metadata(&path).unwrap().file_type() != made {
                std::fs::remove_file(&path).unwrap();
                make(kind, &path);
            }
            let s = Store::open(store.root()).unwrap();
            let sc = scratch.clone();
            let what = format!("{name} with {layer}/{file} {called}");
            let r = guarded(&what, move || op(&s, &sc));
            if must_refuse.contains(&name) {
                let e = r.expect_err(&format!("{what}: accepted"));
                assert!(e.contains(&want), "{what}: {e}");
            } else if let Err(e) = r {
                // Another entry point may fail, but not for this file.
                assert!(!e.contains(file), "{what}: {e}");
            }
        }
    }
}

#[test]
fn a_special_file_as_a_manifest_is_refused_by_every_entry_point() {
    check_position("d1", MANIFEST_FILE);
    check_position("base", MANIFEST_FILE);
}

#[test]
fn a_special_file_as_memory_state_or_disk_is_refused_where_it_is_read() {
    for layer in ["base", "d1"] {
        for file in LAYER_FILES.into_iter().filter(|f| *f != MANIFEST_FILE) {
            check_position(layer, file);
        }
    }
}

#[test]
fn a_special_file_as_the_verified_file_cache_is_ignored_with_a_note() {
    check_position("d1", VERIFIED_FILE);
}

#[test]
fn a_special_file_as_a_layer_directory_hangs_nothing() {
    for layer in ["base", "d1", "other"] {
        // (A directory there is a layer without files.)
        for kind in [Special::Fifo, Special::Socket, Special::Device] {
            let (dir, store) = fixture();
            let path: PathBuf = store.root().join(layer);
            std::fs::remove_dir_all(&path).unwrap();
            let called = make(kind, &path);
            let scratch = dir.path().to_path_buf();
            for (name, op) in ENTRY_POINTS {
                let s = Store::open(store.root()).unwrap();
                let sc = scratch.clone();
                let what = format!("{name} with {layer} {called}");
                // Not a layer: skipped by listings, "not found" by name.
                if let Err(e) = guarded(&what, move || op(&s, &sc)) {
                    assert!(
                        e.contains(&format!("'{layer}' not found"))
                            || e.contains(&format!("'{layer}', which is not in store")),
                        "{what}: {e}"
                    );
                }
            }
            let names = store.layer_names().unwrap();
            assert!(!names.contains(&layer.to_string()), "{names:?}");
        }
    }
}
