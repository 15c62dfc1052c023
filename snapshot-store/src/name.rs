//! Snapshot names and the restore spec grammar.

use crate::error::{Error, Result};

/// Longest snapshot name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Check a snapshot name: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
///
/// Names never start with `.` (so they cannot collide with `.tmp-*` work
/// directories, `.` or `..`) and never contain `+` (reserved for `NAME+N`)
/// or `/`.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |why| {
        Err(Error::InvalidName {
            name: name.to_string(),
            why,
        })
    };
    let bytes = name.as_bytes();
    let Some(&first) = bytes.first() else {
        return bad("empty");
    };
    if bytes.len() > MAX_NAME_LEN {
        return bad("longer than 64 bytes");
    }
    if !first.is_ascii_alphanumeric() {
        return bad("must start with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad("only letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// A parsed restore spec: `NAME` or `NAME+N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The named snapshot.
    pub name: String,
    /// How many layers below `name` to descend along a single-child chain
    /// (`0` for a plain `NAME`).
    pub descend: u32,
}

impl Spec {
    /// Parse `NAME` or `NAME+N` (N a decimal number, no sign, at most
    /// 9 digits). `NAME+0` is the same as `NAME`.
    pub fn parse(spec: &str) -> Result<Spec> {
        let bad = |why: &str| {
            Err(Error::InvalidSpec {
                spec: spec.to_string(),
                why: why.to_string(),
            })
        };
        let (name, descend) = match spec.split_once('+') {
            None => (spec, 0),
            Some((name, n)) => {
                if n.is_empty() {
                    return bad("expected a number after '+'");
                }
                if n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return bad("the part after '+' must be a decimal number of at most 9 digits");
                }
                let Ok(n) = n.parse::<u32>() else {
                    return bad("the part after '+' is not a number");
                };
                (name, n)
            }
        };
        if let Err(Error::InvalidName { why, .. }) = validate_name(name) {
            return bad(&format!("snapshot name {name:?}: {why}"));
        }
        Ok(Spec {
            name: name.to_string(),
            descend,
        })
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.descend == 0 {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}+{}", self.name, self.descend)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "golden", "d1", "A.b_c-d", "0", &"x".repeat(64)] {
            validate_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "",
            ".tmp",
            "-a",
            "_a",
            "a+1",
            "a/b",
            "..",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn specs() {
        let s = Spec::parse("golden").unwrap();
        assert_eq!((s.name.as_str(), s.descend), ("golden", 0));
        let s = Spec::parse("golden+0").unwrap();
        assert_eq!((s.name.as_str(), s.descend), ("golden", 0));
        let s = Spec::parse("g.1+12").unwrap();
        assert_eq!((s.name.as_str(), s.descend), ("g.1", 12));
        assert_eq!(s.to_string(), "g.1+12");
        for bad in [
            "",
            "+1",
            "a+",
            "a+-1",
            "a++1",
            "a+1+2",
            "a+x",
            "a+ 1",
            "a+1234567890",
            ".a+1",
            "a b",
        ] {
            let e = Spec::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidSpec { .. }), "{bad:?}: {e}");
        }
    }
}
