//! The registry end: an `oci-client` client for one repository, its
//! credentials, and errors turned into [`RegistryError`]s that name the
//! operation (distribution-spec v1.1 endpoints: `GET`/`HEAD`/`PUT
//! /v2/<name>/manifests/<reference>`, `HEAD`/`GET /v2/<name>/blobs/<digest>`,
//! `POST /v2/<name>/blobs/uploads/` with `?mount=`).

use futures_util::Stream;
use oci_client::client::{ClientConfig, ClientProtocol, SizedStream};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use super::auth::{AuthFile, Credential};
use super::layout::{digest_of, MAX_OCI_MANIFEST_BYTES, OCI_MANIFEST_MEDIA_TYPE};
use super::{Connection, RegistryError};

/// One repository of one registry, authenticated for `operation`.
pub(crate) struct Registry {
    client: Client,
    /// The reference as given (repository, tag or digest).
    pub reference: Reference,
    credential: &'static str,
    from: String,
}

/// Parse `REGISTRY/REPOSITORY[:TAG][@DIGEST]`. The registry part is
/// required (no implicit Docker Hub).
pub(crate) fn parse_reference(reference: &str) -> Result<Reference, RegistryError> {
    let bad = |msg: String| RegistryError::Reference {
        reference: reference.to_string(),
        msg,
    };
    let first = reference.split('/').next().unwrap_or("");
    if !reference.contains('/')
        || !(first.contains('.') || first.contains(':') || first == "localhost")
    {
        return Err(bad(
            "expected REGISTRY/REPOSITORY[:TAG], e.g. localhost:5000/sandboxes/py:v1 (the registry host is required)".into(),
        ));
    }
    reference
        .parse::<Reference>()
        .map_err(|e| bad(e.to_string()))
}

/// `e` and its sources, `: `-separated (an HTTP client's "error sending
/// request" says why only in its sources: refused connection, TLS).
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        cur = s.source();
    }
    msg
}

fn is_auth_error(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::UnauthorizedError { .. } => true,
        OciDistributionError::ServerError { code, .. } => *code == 401 || *code == 403,
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|x| matches!(x.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)),
        OciDistributionError::RequestError(r) => r
            .status()
            .is_some_and(|s| s.as_u16() == 401 || s.as_u16() == 403),
        _ => false,
    }
}

impl Registry {
    /// A client for `reference`, with the credential of `conn` or the auth
    /// file's entry for its registry, authenticated for `operation` (for a
    /// bearer-token registry, a token is fetched now).
    pub(crate) async fn connect(
        reference: &str,
        conn: &Connection,
        operation: RegistryOperation,
    ) -> Result<Registry, RegistryError> {
        let reference = parse_reference(reference)?;
        let host = reference.resolve_registry().to_string();
        let (credential, from) = match &conn.credential {
            Some(c) => (c.clone(), String::new()),
            None => {
                let file = AuthFile::from_environment()?;
                let c = file.credential(&host);
                let from = match (&c, &file.path) {
                    (Credential::Anonymous, _) | (_, None) => String::new(),
                    (_, Some(p)) => format!(" from {}", p.display()),
                };
                (c, from)
            }
        };
        tracing::debug!("{host}: {} credentials{from}", credential.kind());
        let auth = match &credential {
            Credential::Anonymous => RegistryAuth::Anonymous,
            Credential::Basic { username, password } => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
            Credential::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        };
        let client = Client::new(ClientConfig {
            protocol: if conn.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            use_monolithic_push: true,
            platform_resolver: None,
            ..ClientConfig::default()
        });
        let r = Registry {
            client,
            reference,
            credential: credential.kind(),
            from,
        };
        let op = format!("authenticate to {host}");
        r.client
            .auth(&r.reference, &auth, operation)
            .await
            .map_err(|e| r.error(&op, e))?;
        Ok(r)
    }

    /// `e`, from doing `op`, as a [`RegistryError`].
    pub(crate) fn error(&self, op: &str, e: OciDistributionError) -> RegistryError {
        if is_auth_error(&e) {
            return RegistryError::Auth {
                op: op.to_string(),
                credential: self.credential,
                from: self.from.clone(),
                msg: chain(&e),
            };
        }
        RegistryError::Registry {
            op: op.to_string(),
            msg: chain(&e),
        }
    }

    /// The repository with `digest` as the reference.
    pub(crate) fn at(&self, digest: &str) -> Reference {
        self.reference.clone_with_digest(digest.to_string())
    }

    /// `registry/repository`, for messages.
    pub(crate) fn repository(&self) -> String {
        format!(
            "{}/{}",
            self.reference.resolve_registry(),
            self.reference.repository()
        )
    }

    /// Whether the repository has the blob `digest` (`HEAD`).
    pub(crate) async fn has_blob(&self, digest: &str) -> Result<bool, RegistryError> {
        self.client
            .blob_exists(&self.reference, digest)
            .await
            .map_err(|e| self.error(&format!("check blob {digest} in {}", self.repository()), e))
    }

    /// Mount the blob `digest` from the repository `from` of the same
    /// registry. `false` if the registry did not mount it (then it must be
    /// uploaded).
    pub(crate) async fn mount(&self, from: &Reference, digest: &str) -> bool {
        match self.client.mount_blob(&self.reference, from, digest).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("mount of {digest} from {} refused: {e}", from.repository());
                false
            }
        }
    }

    /// Upload a blob of `size` bytes from `stream` as `digest` (one
    /// monolithic `PUT`).
    pub(crate) async fn push_blob_stream<S>(
        &self,
        stream: S,
        digest: &str,
        size: u64,
    ) -> Result<(), RegistryError>
    where
        S: Stream<Item = oci_client::errors::Result<bytes::Bytes>> + Send + 'static,
    {
        self.client
            .push_blob_stream(&self.reference, stream, digest, Some(size))
            .await
            .map(|_| ())
            .map_err(|e| self.error(&format!("upload blob {digest} to {}", self.repository()), e))
    }

    /// Upload the small blob `data` (its digest computed here).
    pub(crate) async fn push_blob_bytes(&self, data: Vec<u8>) -> Result<(), RegistryError> {
        let digest = digest_of(&data);
        self.client
            .push_blob(&self.reference, data, &digest)
            .await
            .map(|_| ())
            .map_err(|e| self.error(&format!("upload blob {digest} to {}", self.repository()), e))
    }

    /// `PUT` the OCI manifest `bytes` under `reference` (a tag or its
    /// digest).
    pub(crate) async fn push_manifest(
        &self,
        reference: &Reference,
        bytes: Vec<u8>,
    ) -> Result<(), RegistryError> {
        let op = format!("push manifest {reference}");
        self.client
            .push_manifest_raw(
                reference,
                bytes,
                OCI_MANIFEST_MEDIA_TYPE.parse().map_err(
                    |e: http::header::InvalidHeaderValue| RegistryError::Registry {
                        op: op.clone(),
                        msg: e.to_string(),
                    },
                )?,
            )
            .await
            .map(|_| ())
            .map_err(|e| self.error(&op, e))
    }

    /// `GET` the OCI manifest `reference` (a tag or a digest): its bytes
    /// and digest. A manifest fetched by digest must hash to it (checked by
    /// the client and again here).
    pub(crate) async fn pull_manifest(
        &self,
        reference: &Reference,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let op = format!("fetch manifest {reference}");
        let (body, digest) = self
            .client
            .pull_manifest_raw(
                reference,
                &RegistryAuth::Anonymous,
                &[OCI_MANIFEST_MEDIA_TYPE],
            )
            .await
            .map_err(|e| self.error(&op, e))?;
        if body.len() > MAX_OCI_MANIFEST_BYTES {
            return Err(RegistryError::Artifact {
                what: reference.to_string(),
                msg: format!(
                    "manifest is {} bytes, more than {MAX_OCI_MANIFEST_BYTES}",
                    body.len()
                ),
            });
        }
        let found = digest_of(&body);
        let want = reference.digest().map(str::to_string).unwrap_or(digest);
        if found != want {
            return Err(RegistryError::Artifact {
                what: reference.to_string(),
                msg: format!("manifest has digest {found}, expected {want}"),
            });
        }
        Ok((body.to_vec(), found))
    }

    /// Start downloading the blob `digest` of `size` bytes.
    pub(crate) async fn blob_stream(
        &self,
        digest: &str,
        size: u64,
    ) -> Result<SizedStream, RegistryError> {
        let desc = OciDescriptor {
            digest: digest.to_string(),
            size: size as i64,
            ..OciDescriptor::default()
        };
        self.client
            .pull_blob_stream(&self.reference, &desc)
            .await
            .map_err(|e| {
                self.error(
                    &format!("fetch blob {digest} from {}", self.repository()),
                    e,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_need_a_registry_host() {
        let r = parse_reference("localhost:5000/sandboxes/py:v1").unwrap();
        assert_eq!(
            (r.resolve_registry(), r.repository(), r.tag()),
            ("localhost:5000", "sandboxes/py", Some("v1"))
        );
        let r = parse_reference("127.0.0.1:5000/a@sha256:0000000000000000000000000000000000000000000000000000000000000000").unwrap();
        assert!(r.digest().is_some());
        assert!(parse_reference("ghcr.io/o/r:t").is_ok());
        let e = parse_reference("sandboxes/py:v1").unwrap_err().to_string();
        assert!(e.contains("registry host is required"), "{e}");
        assert!(parse_reference("py").is_err());
        assert!(parse_reference("localhost:5000/UPPER:t").is_err());
    }
}
