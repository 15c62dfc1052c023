//! The restore spec grammar: NAME, NAME+0, NAME+N, branches, short
//! chains, bad names.

mod common;

use common::*;
use snapshot_store::{Error, Store};

/// golden -> d1 -> d2 -> d3a -> d4
///                     \-> d3b
/// other (full, alone)
fn fixture() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let ram = vec![1u8; 8 * PS as usize];
    let g = full(&s, "golden", &ram, b"", None);
    let d1 = diff(&s, "d1", &g, &ram, &[1], b"", None);
    let d2 = diff(&s, "d2", &d1, &ram, &[2], b"", None);
    let d3a = diff(&s, "d3a", &d2, &ram, &[3], b"", None);
    diff(&s, "d3b", &d2, &ram, &[4], b"", None);
    diff(&s, "d4", &d3a, &ram, &[5], b"", None);
    full(&s, "other", &ram, b"", None);
    (dir, s)
}

fn names(s: &Store, spec: &str) -> String {
    s.resolve(spec).unwrap().describe()
}

#[test]
fn plain_names_resolve_with_their_ancestry() {
    let (_d, s) = fixture();
    assert_eq!(names(&s, "golden"), "golden");
    assert_eq!(names(&s, "d2"), "golden -> d1 -> d2");
    assert_eq!(names(&s, "d4"), "golden -> d1 -> d2 -> d3a -> d4");
    assert_eq!(names(&s, "d3b"), "golden -> d1 -> d2 -> d3b");
    assert_eq!(names(&s, "other"), "other");
    let c = s.resolve("d4").unwrap();
    assert_eq!(c.base().name, "golden");
    assert_eq!(c.top().name, "d4");
    assert_eq!(c.len(), 5);
}

#[test]
fn plus_n_descends_single_child_chains() {
    let (_d, s) = fixture();
    assert_eq!(names(&s, "golden+0"), "golden");
    assert_eq!(names(&s, "golden+1"), "golden -> d1");
    assert_eq!(names(&s, "golden+2"), "golden -> d1 -> d2");
    assert_eq!(names(&s, "d1+1"), "golden -> d1 -> d2");
    assert_eq!(names(&s, "d3a+1"), "golden -> d1 -> d2 -> d3a -> d4");
    assert_eq!(names(&s, "d4+0"), names(&s, "d4"));
}

#[test]
fn branch_lists_the_children() {
    let (_d, s) = fixture();
    let e = s.resolve("golden+3").unwrap_err();
    assert!(
        matches!(&e, Error::Descent { spec, .. } if spec == "golden+3"),
        "{e}"
    );
    let e = e.to_string();
    assert!(
        e.contains("'d2' has 2 children (d3a, d3b)") && e.contains("golden -> d1 -> d2"),
        "{e}"
    );
    let e = s.resolve("d2+1").unwrap_err().to_string();
    assert!(e.contains("d3a, d3b"), "{e}");
}

#[test]
fn too_short_shows_what_exists() {
    let (_d, s) = fixture();
    let e = s.resolve("d3a+2").unwrap_err();
    assert!(matches!(e, Error::Descent { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("too short")
            && e.contains("only 1 layer(s) below 'd3a'")
            && e.contains("d3a -> d4"),
        "{e}"
    );
    let e = s.resolve("other+1").unwrap_err().to_string();
    assert!(e.contains("only 0 layer(s)"), "{e}");
}

#[test]
fn bad_specs_and_unknown_names() {
    let (_d, s) = fixture();
    for bad in [
        "",
        "+1",
        "golden+",
        "golden+-1",
        "golden+x",
        "a/b",
        "../x",
        ".tmp-x",
        "golden+1+1",
    ] {
        let e = s.resolve(bad).unwrap_err();
        assert!(
            matches!(e, Error::InvalidSpec { .. } | Error::InvalidName { .. }),
            "{bad:?}: {e}"
        );
    }
    let e = s.resolve("nope+1").unwrap_err();
    assert!(
        matches!(&e, Error::NotFound { existing, .. } if existing.len() == 7),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("existing: d1, d2, d3a, d3b, d4, golden, other"),
        "{e}"
    );
}

#[test]
fn unreadable_layer_blocks_descent_but_not_plain_names() {
    let (_d, s) = fixture();
    std::fs::create_dir(s.root().join("junk")).unwrap();
    // A plain name needs only its ancestry.
    assert_eq!(names(&s, "d2"), "golden -> d1 -> d2");
    // NAME+N cannot know whether 'junk' is a child.
    let e = s.resolve("golden+1").unwrap_err();
    match &e {
        Error::UnreadableLayer { layer, cause } => {
            assert_eq!(layer, "junk");
            assert!(matches!(**cause, Error::Corrupt { .. }), "{cause}");
        }
        e => panic!("{e}"),
    }
    let e = e.to_string();
    assert!(
        e.contains("'junk' is unreadable") && e.contains("manifest.json"),
        "{e}"
    );
}

#[test]
fn cycles_and_renamed_dirs_are_refused() {
    let (_d, s) = fixture();
    // A layer directory renamed by hand no longer matches its manifest.
    std::fs::rename(s.root().join("d4"), s.root().join("d5")).unwrap();
    let e = s.resolve("d5").unwrap_err().to_string();
    assert!(e.contains("describes snapshot 'd4'"), "{e}");
    // A forged (but well-formed and sealed) manifest making d1 a child of d2.
    let d2 = s.layer("d2").unwrap();
    let mut m = s.layer("d1").unwrap().manifest;
    m.parent = Some(d2.parent_ref());
    m.seal();
    make_writable(s.root());
    std::fs::write(s.root().join("d1/manifest.json"), m.to_bytes()).unwrap();
    let e = s.resolve("d2").unwrap_err().to_string();
    assert!(e.contains("cycle"), "{e}");
}
