//! Registry credentials as the container tools keep them: a JSON auth file
//! (`$REGISTRY_AUTH_FILE`, else `$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`) whose `auths` map holds, per registry, a base64
//! `auth` field (`user:password`), or `username` and `password`, or a
//! `registrytoken` (a bearer token sent as is).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use super::RegistryError;

/// Largest auth file read, in bytes.
pub const MAX_AUTH_FILE_BYTES: u64 = 1 << 20;

/// How to authenticate to one registry.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// No credentials (a registry that allows anonymous access).
    Anonymous,
    /// HTTP Basic credentials; also what a bearer-token registry's token
    /// endpoint is asked with (distribution `token.md`).
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
    /// A bearer token sent as is.
    Bearer(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Anonymous => f.write_str("Anonymous"),
            Credential::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credential::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl Credential {
    /// `anonymous`, `basic` or `bearer`, for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Credential::Anonymous => "anonymous",
            Credential::Basic { .. } => "basic",
            Credential::Bearer(_) => "bearer",
        }
    }
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

#[derive(Deserialize, Default)]
struct FileForm {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

/// A parsed auth file.
#[derive(Debug, Clone, Default)]
pub struct AuthFile {
    /// Where it was read from (for messages).
    pub path: Option<PathBuf>,
    entries: BTreeMap<String, Credential>,
    helpers: BTreeMap<String, String>,
    store: Option<String>,
}

/// The registry host (`host[:port]`) an `auths` key names: keys may be a
/// bare host, or a URL such as `https://index.docker.io/v1/`.
pub fn normalize_registry(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

/// The auth file to read: `$REGISTRY_AUTH_FILE`, else
/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`; `None`
/// if none is set.
pub fn auth_file_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REGISTRY_AUTH_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(d) = std::env::var_os("DOCKER_CONFIG").filter(|p| !p.is_empty()) {
        return Some(Path::new(&d).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".docker").join("config.json"))
}

impl AuthFile {
    /// Parse the bytes of an auth file (`path` names it in errors).
    pub fn parse(bytes: &[u8], path: Option<&Path>) -> Result<AuthFile, RegistryError> {
        let shown = path.map_or("auth file".to_string(), |p| p.display().to_string());
        let bad = |msg: String| RegistryError::AuthFile {
            path: shown.clone(),
            msg,
        };
        let form: FileForm =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let mut entries = BTreeMap::new();
        for (key, e) in form.auths {
            let cred = if let Some(token) = e.registrytoken.filter(|t| !t.is_empty()) {
                Credential::Bearer(token)
            } else if let Some(auth) = e.auth.filter(|a| !a.is_empty()) {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|err| bad(format!("auths.{key:?}.auth is not base64: {err}")))?;
                let text = String::from_utf8(raw)
                    .map_err(|_| bad(format!("auths.{key:?}.auth is not UTF-8 once decoded")))?;
                let Some((username, password)) = text.split_once(':') else {
                    return Err(bad(format!(
                        "auths.{key:?}.auth does not decode to user:password"
                    )));
                };
                Credential::Basic {
                    username: username.to_string(),
                    password: password.to_string(),
                }
            } else if let (Some(username), Some(password)) = (e.username, e.password) {
                Credential::Basic { username, password }
            } else if e.identitytoken.is_some() {
                return Err(bad(format!(
                    "auths.{key:?} has only an identitytoken (an OAuth refresh token), which is not supported; log in with a user name and password"
                )));
            } else {
                continue;
            };
            entries.insert(normalize_registry(&key), cred);
        }
        Ok(AuthFile {
            path: path.map(Path::to_path_buf),
            entries,
            helpers: form
                .cred_helpers
                .into_iter()
                .map(|(k, v)| (normalize_registry(&k), v))
                .collect(),
            store: form.creds_store,
        })
    }

    /// Read the auth file at `path`; a missing file is an empty one.
    pub fn load(path: &Path) -> Result<AuthFile, RegistryError> {
        use std::io::Read;
        let f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(AuthFile {
                    path: Some(path.to_path_buf()),
                    ..AuthFile::default()
                })
            }
            Err(e) => {
                return Err(RegistryError::AuthFile {
                    path: path.display().to_string(),
                    msg: format!("open: {e}"),
                })
            }
        };
        let mut bytes = Vec::new();
        f.take(MAX_AUTH_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| RegistryError::AuthFile {
                path: path.display().to_string(),
                msg: format!("read: {e}"),
            })?;
        if bytes.len() as u64 > MAX_AUTH_FILE_BYTES {
            return Err(RegistryError::AuthFile {
                path: path.display().to_string(),
                msg: format!("larger than {MAX_AUTH_FILE_BYTES} bytes"),
            });
        }
        AuthFile::parse(&bytes, Some(path))
    }

    /// The auth file of [`auth_file_path`], or an empty one if none.
    pub fn from_environment() -> Result<AuthFile, RegistryError> {
        match auth_file_path() {
            Some(p) => AuthFile::load(&p),
            None => Ok(AuthFile::default()),
        }
    }

    /// The credential for `registry` (`host[:port]`): its entry, else
    /// [`Credential::Anonymous`]. A registry configured only through a
    /// credential helper (`credHelpers`, `credsStore`) is reported in the
    /// log and accessed anonymously: helpers are not run.
    pub fn credential(&self, registry: &str) -> Credential {
        let key = normalize_registry(registry);
        if let Some(c) = self.entries.get(&key) {
            return c.clone();
        }
        if let Some(h) = self.helpers.get(&key).or(self.store.as_ref()) {
            tracing::warn!(
                "{registry}: credential helper docker-credential-{h} is configured but not run; trying anonymous access"
            );
        }
        Credential::Anonymous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn auths_map_with_base64_auth_fields() {
        let text = format!(
            r#"{{"auths": {{
                "127.0.0.1:5000": {{"auth": "{}"}},
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "ghcr.io": {{"username": "u", "password": "p"}},
                "tok.example": {{"registrytoken": "T0K"}},
                "empty.example": {{}}
            }}, "HttpHeaders": {{"User-Agent": "x"}}}}"#,
            b64("alice:pa:ss"),
            b64("bob:pw")
        );
        let f = AuthFile::parse(text.as_bytes(), None).unwrap();
        assert_eq!(
            f.credential("127.0.0.1:5000"),
            Credential::Basic {
                username: "alice".into(),
                password: "pa:ss".into()
            }
        );
        assert_eq!(
            f.credential("docker.io"),
            Credential::Basic {
                username: "bob".into(),
                password: "pw".into()
            }
        );
        assert_eq!(
            f.credential("GHCR.io"),
            Credential::Basic {
                username: "u".into(),
                password: "p".into()
            }
        );
        assert_eq!(
            f.credential("tok.example"),
            Credential::Bearer("T0K".into())
        );
        assert_eq!(f.credential("empty.example"), Credential::Anonymous);
        assert_eq!(f.credential("127.0.0.1:5001"), Credential::Anonymous);
        assert!(!format!("{:?}", f.credential("127.0.0.1:5000")).contains("pa:ss"));
    }

    #[test]
    fn bad_auth_files_name_the_file_and_entry() {
        let p = Path::new("/x/auth.json");
        let e = AuthFile::parse(b"{", Some(p)).unwrap_err().to_string();
        assert!(e.contains("/x/auth.json") && e.contains("JSON"), "{e}");
        let e = AuthFile::parse(br#"{"auths": {"r": {"auth": "!!"}}}"#, Some(p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"r\"") && e.contains("base64"), "{e}");
        let text = format!(r#"{{"auths": {{"r": {{"auth": "{}"}}}}}}"#, b64("nocolon"));
        let e = AuthFile::parse(text.as_bytes(), Some(p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("user:password"), "{e}");
        let e = AuthFile::parse(br#"{"auths": {"r": {"identitytoken": "x"}}}"#, Some(p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("identitytoken"), "{e}");
    }

    #[test]
    fn registry_keys_are_normalized() {
        assert_eq!(
            normalize_registry("https://index.docker.io/v1/"),
            "docker.io"
        );
        assert_eq!(
            normalize_registry("http://LocalHost:5000/"),
            "localhost:5000"
        );
        assert_eq!(normalize_registry("quay.io"), "quay.io");
    }

    #[test]
    fn a_missing_file_is_empty() {
        let d = tempfile::tempdir().unwrap();
        let f = AuthFile::load(&d.path().join("none.json")).unwrap();
        assert_eq!(f.credential("r"), Credential::Anonymous);
    }
}
