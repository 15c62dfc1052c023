//! The registry end: one repository of one registry, its credentials, and
//! the requests `vmstore` makes (distribution-spec v1.1: `GET /v2/`,
//! `GET`/`PUT /v2/<name>/manifests/<reference>`, `HEAD`/`GET
//! /v2/<name>/blobs/<digest>`, `POST /v2/<name>/blobs/uploads/` with or
//! without `?mount=`, then the `PUT` to its `Location`; a bearer token from
//! the registry's token endpoint, distribution `token.md`), each through
//! `transport`'s limits, with failures turned into [`RegistryError`]s that
//! name the operation.

use std::sync::Mutex;

use bytes::Bytes;
use futures_util::Stream;
use oci_spec::distribution::Reference;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use tokio::time::Instant;

use super::auth::{AuthFile, Credential};
use super::layout::{digest_of, MAX_OCI_MANIFEST_BYTES, OCI_MANIFEST_MEDIA_TYPE};
use super::transport::{
    host_of, Backoff, Failure, Http, Kind, TransferProblem, Watch, MAX_TOKEN_BYTES,
};
use super::{Connection, RegistryError};

/// How long a token is used when its endpoint does not say (distribution
/// `token.md`: `expires_in` defaults to 60 s).
const DEFAULT_TOKEN_SECS: u64 = 60;

/// What is sent in `Authorization`.
enum Auth {
    /// Nothing (anonymous access).
    None,
    /// HTTP Basic, after the registry asked for it.
    Basic { username: String, password: String },
    /// A bearer token: given, or from a token endpoint (`renew`), fetched
    /// again once it expires.
    Bearer {
        token: String,
        renew: Option<(Instant, TokenEndpoint)>,
    },
}

/// Where a token comes from: a `Bearer` challenge's realm and service, the
/// scopes asked for and the credentials presented.
#[derive(Clone)]
struct TokenEndpoint {
    realm: Url,
    service: Option<String>,
    scopes: Vec<String>,
    basic: Option<(String, String)>,
}

/// One repository of one registry, authenticated for the access asked.
pub(crate) struct Registry {
    http: Http,
    /// The reference as given (repository, tag or digest).
    pub reference: Reference,
    /// `SCHEME://HOST/`.
    base: Url,
    auth: Mutex<Auth>,
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

/// The token scopes of pulling `repository`, or of pushing to it (and
/// pulling from `mount_from` to mount its blobs).
pub(crate) fn scopes(repository: &str, push: bool, mount_from: Option<&Reference>) -> Vec<String> {
    let mut s = vec![format!(
        "repository:{repository}:{}",
        if push { "pull,push" } else { "pull" }
    )];
    s.extend(mount_from.map(|m| format!("repository:{}:pull", m.repository())));
    s
}

/// The `Bearer` challenge of a `WWW-Authenticate` value: realm and service.
fn bearer_challenge(value: &str) -> Option<(String, Option<String>)> {
    let challenges = http_auth::parse_challenges(value).ok()?;
    let c = challenges
        .iter()
        .find(|c| c.scheme.eq_ignore_ascii_case("Bearer"))?;
    let param = |name: &str| {
        c.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_unescaped())
    };
    Some((param("realm")?, param("service")))
}

/// The fields of a token endpoint's answer `vmstore` uses.
#[derive(serde::Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl Registry {
    /// A client for `reference` with the credential of `conn` or the auth
    /// file's entry for its registry. Asks the registry (`GET /v2/`) how
    /// to authenticate; for a `Bearer` challenge, fetches a token for
    /// `scopes` now.
    pub(crate) async fn connect(
        reference: &str,
        conn: &Connection,
        scopes: impl FnOnce(&Reference) -> Vec<String>,
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
        let op = format!("authenticate to {host}");
        let http = Http::new(conn.limits).map_err(|msg| RegistryError::Registry {
            op: op.clone(),
            msg,
        })?;
        let scheme = if conn.plain_http { "http" } else { "https" };
        let base =
            Url::parse(&format!("{scheme}://{host}/")).map_err(|e| RegistryError::Reference {
                reference: reference.to_string(),
                msg: e.to_string(),
            })?;
        let scopes = scopes(&reference);
        let r = Registry {
            http,
            reference,
            base,
            auth: Mutex::new(Auth::None),
            credential: credential.kind(),
            from,
        };
        let auth = match credential {
            Credential::Bearer(token) => Auth::Bearer { token, renew: None },
            Credential::Anonymous => r.challenge(None, scopes, &op).await?,
            Credential::Basic { username, password } => {
                r.challenge(Some((username, password)), scopes, &op).await?
            }
        };
        *r.auth.lock().unwrap_or_else(|p| p.into_inner()) = auth;
        Ok(r)
    }

    /// `GET /v2/`: an answer other than 401 asks for no credentials (none
    /// are sent), a `Basic` challenge gets the basic credentials, a
    /// `Bearer` one a token fetched with them.
    async fn challenge(
        &self,
        basic: Option<(String, String)>,
        scopes: Vec<String>,
        op: &str,
    ) -> Result<Auth, RegistryError> {
        let url = self.url("v2/")?;
        let mut backoff = Backoff::new(&self.http.limits);
        // None: no credentials asked for; Some(None): not a bearer challenge.
        let challenge = loop {
            let watch = self.http.watch("GET", &url, "the API version check", 0);
            let r = match watch.send(self.http.client.get(url.clone())).await {
                Ok(resp) if resp.status() == StatusCode::UNAUTHORIZED => Ok(Some(
                    resp.headers()
                        .get_all(reqwest::header::WWW_AUTHENTICATE)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .find_map(bearer_challenge),
                )),
                Ok(resp) if resp.status().is_server_error() => Err(watch.status(resp).await),
                Ok(_) => Ok(None),
                Err(f) => Err(f),
            };
            match r {
                Ok(c) => break c,
                Err(f) if backoff.retry(&f).await => continue,
                Err(f) => return Err(self.error(op, f, backoff.attempts())),
            }
        };
        let ((realm, service), basic) = match (challenge, basic) {
            (None, _) | (Some(None), None) => return Ok(Auth::None),
            (Some(None), Some((username, password))) => {
                return Ok(Auth::Basic { username, password })
            }
            (Some(Some(c)), basic) => (c, basic),
        };
        let endpoint = TokenEndpoint {
            realm: self.realm(&realm, op)?,
            service,
            scopes,
            basic,
        };
        let mut backoff = Backoff::new(&self.http.limits);
        loop {
            match self.fetch_token(&endpoint).await {
                Ok((token, until)) => {
                    return Ok(Auth::Bearer {
                        token,
                        renew: Some((until, endpoint)),
                    })
                }
                Err(f) if backoff.retry(&f).await => continue,
                Err(f) => return Err(self.error(op, f, backoff.attempts())),
            }
        }
    }

    /// The token endpoint `realm` of a challenge: an absolute HTTP(S) URL,
    /// HTTPS if the registry is.
    fn realm(&self, realm: &str, op: &str) -> Result<Url, RegistryError> {
        let bad = |msg: String| RegistryError::Registry {
            op: op.to_string(),
            msg: format!("the registry's token endpoint {realm:?} {msg}"),
        };
        let url = Url::parse(realm).map_err(|e| bad(format!("is not a URL: {e}")))?;
        match (self.base.scheme(), url.scheme()) {
            (_, "https") | ("http", "http") => Ok(url),
            ("https", "http") => Err(bad(
                "is plain HTTP for an HTTPS registry: refused (credentials and tokens would travel in the clear)".into(),
            )),
            (_, s) => Err(bad(format!("has scheme {s:?}, not https"))),
        }
    }

    /// One request for a token: `(token, when to fetch another)`.
    async fn fetch_token(&self, e: &TokenEndpoint) -> Result<(String, Instant), Failure> {
        let mut url = e.realm.clone();
        {
            let mut q = url.query_pairs_mut();
            for s in &e.scopes {
                q.append_pair("scope", s);
            }
            if let Some(s) = &e.service {
                q.append_pair("service", s);
            }
        }
        let what = format!("the token from {}", host_of(&url));
        let watch = self.http.watch("GET", &url, &what, MAX_TOKEN_BYTES);
        let mut rb = self.http.client.get(url);
        if let Some((u, p)) = &e.basic {
            rb = rb.basic_auth(u, Some(p));
        }
        let mut resp = watch.send(rb).await?;
        if resp.status() != StatusCode::OK {
            return Err(watch.status(resp).await);
        }
        let body = watch.read_capped(&mut resp, MAX_TOKEN_BYTES).await?;
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|err| watch.fail(Kind::Fatal(format!("not a token answer: {err}"))))?;
        let token = answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| watch.fail(Kind::Fatal("the answer has no token".into())))?;
        // Fetch another a tenth of its life (at most 30 s) before it
        // expires, and at least daily.
        let life = answer
            .expires_in
            .unwrap_or(DEFAULT_TOKEN_SECS)
            .clamp(1, 24 * 3600);
        let until = Instant::now() + std::time::Duration::from_secs(life - (life / 10).min(30));
        Ok((token, until))
    }

    /// `path` under the registry's base URL.
    fn url(&self, path: &str) -> Result<Url, RegistryError> {
        self.base.join(path).map_err(|e| RegistryError::Reference {
            reference: self.reference.to_string(),
            msg: format!("{path}: {e}"),
        })
    }

    /// A request to `url`, with the credentials when `url` is on the
    /// registry itself (same scheme, host and port: never sent to another
    /// host an upload's `Location` names). An expired token is renewed
    /// first.
    async fn request(&self, method: Method, url: Url) -> Result<RequestBuilder, Failure> {
        let rb = self.http.client.request(method, url.clone());
        if url.origin() != self.base.origin() {
            return Ok(rb);
        }
        let expired = match &*self.auth.lock().unwrap_or_else(|p| p.into_inner()) {
            Auth::Bearer {
                renew: Some((until, e)),
                ..
            } if Instant::now() >= *until => Some(e.clone()),
            _ => None,
        };
        if let Some(e) = expired {
            let (token, until) = self.fetch_token(&e).await?;
            *self.auth.lock().unwrap_or_else(|p| p.into_inner()) = Auth::Bearer {
                token,
                renew: Some((until, e)),
            };
        }
        Ok(
            match &*self.auth.lock().unwrap_or_else(|p| p.into_inner()) {
                Auth::None => rb,
                Auth::Basic { username, password } => rb.basic_auth(username, Some(password)),
                Auth::Bearer { token, .. } => {
                    match HeaderValue::from_str(&format!("Bearer {token}")) {
                        Ok(mut v) => {
                            v.set_sensitive(true);
                            rb.header(AUTHORIZATION, v)
                        }
                        Err(_) => rb,
                    }
                }
            },
        )
    }

    /// `f`, from doing `op` (after `attempts` attempts), as a
    /// [`RegistryError`].
    pub(crate) fn error(&self, op: &str, f: Failure, attempts: u32) -> RegistryError {
        let after = if attempts > 1 {
            format!("; gave up after {attempts} attempts")
        } else {
            String::new()
        };
        match f.kind {
            Kind::Status { status, .. }
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN =>
            {
                RegistryError::Auth {
                    op: op.to_string(),
                    credential: self.credential,
                    from: self.from.clone(),
                    msg: f.to_string(),
                }
            }
            Kind::Transfer(problem) => RegistryError::Transfer {
                request: f.request,
                problem,
                attempts,
            },
            _ => RegistryError::Registry {
                op: op.to_string(),
                msg: format!("{f}{after}"),
            },
        }
    }

    /// The retries of one request.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(&self.http.limits)
    }

    /// Do `attempt` until it succeeds, or fails for good (see
    /// [`Backoff::retry`]); `op` names it in the error.
    async fn retrying<T, F, Fut>(&self, op: &str, mut attempt: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut backoff = self.backoff();
        loop {
            match attempt().await {
                Ok(v) => return Ok(v),
                Err(f) if backoff.retry(&f).await => {}
                Err(f) => return Err(self.error(op, f, backoff.attempts())),
            }
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

    fn blob_url(&self, digest: &str) -> Result<Url, RegistryError> {
        self.url(&format!(
            "v2/{}/blobs/{digest}",
            self.reference.repository()
        ))
    }

    fn manifest_url(&self, reference: &Reference) -> Result<Url, RegistryError> {
        let r = match (reference.digest(), reference.tag()) {
            (Some(d), _) => d,
            (None, t) => t.unwrap_or("latest"),
        };
        self.url(&format!("v2/{}/manifests/{r}", reference.repository()))
    }

    /// Whether the repository has the blob `digest` (`HEAD`).
    pub(crate) async fn has_blob(&self, digest: &str) -> Result<bool, RegistryError> {
        let url = self.blob_url(digest)?;
        let what = format!("blob {digest}");
        let op = format!("check blob {digest} in {}", self.repository());
        self.retrying(&op, || async {
            let watch = self.http.watch("HEAD", &url, &what, 0);
            let resp = watch
                .send(self.request(Method::HEAD, url.clone()).await?)
                .await?;
            match resp.status() {
                s if s.is_success() => Ok(true),
                StatusCode::NOT_FOUND => Ok(false),
                _ => Err(watch.status(resp).await),
            }
        })
        .await
    }

    /// Mount the blob `digest` from the repository `from` of the same
    /// registry. `false` if the registry did not mount it, or the request
    /// failed (then it must be uploaded). Not retried.
    pub(crate) async fn mount(&self, from: &Reference, digest: &str) -> bool {
        let Ok(mut url) = self.url(&format!(
            "v2/{}/blobs/uploads/",
            self.reference.repository()
        )) else {
            return false;
        };
        url.query_pairs_mut()
            .append_pair("mount", digest)
            .append_pair("from", from.repository());
        let watch = self.http.watch("POST", &url, "the mount", 0);
        let r = async {
            let rb = self.request(Method::POST, url.clone()).await?;
            let resp = watch.send(rb.header(CONTENT_LENGTH, 0)).await?;
            match resp.status() {
                StatusCode::CREATED => Ok(true),
                // 202: an upload session began instead; left to expire.
                s if s.is_success() => Ok(false),
                _ => Err(watch.status(resp).await),
            }
        };
        match r.await {
            Ok(m) => m,
            Err(f) => {
                tracing::debug!("mount of {digest} from {} refused: {f}", from.repository());
                false
            }
        }
    }

    /// `POST /v2/<name>/blobs/uploads/`: the upload session's URL, with
    /// the blob's `digest` added to its query.
    async fn begin_upload(&self, digest: &str) -> Result<Url, Failure> {
        let url = self
            .url(&format!(
                "v2/{}/blobs/uploads/",
                self.reference.repository()
            ))
            .map_err(|e| Failure {
                request: "POST".into(),
                kind: Kind::Fatal(e.to_string()),
            })?;
        let watch = self
            .http
            .watch("POST", &url, &format!("the upload of {digest}"), 0);
        let rb = self.request(Method::POST, url.clone()).await?;
        let resp = watch.send(rb.header(CONTENT_LENGTH, 0)).await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(watch.status(resp).await);
        }
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| watch.fail(Kind::Fatal("the answer has no Location".into())))?;
        let mut at = resp
            .url()
            .join(location)
            .map_err(|e| watch.fail(Kind::Fatal(format!("Location {location:?}: {e}"))))?;
        at.query_pairs_mut().append_pair("digest", digest);
        Ok(at)
    }

    /// Upload the blob `digest` of `size` bytes (one monolithic `PUT`),
    /// its bytes from `body()`, called again for each attempt: a failed
    /// upload is restarted from its start (`POST`).
    pub(crate) async fn upload<S>(
        &self,
        digest: &str,
        size: u64,
        body: impl Fn() -> Result<S, RegistryError>,
    ) -> Result<(), RegistryError>
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    {
        let op = format!("upload blob {digest} to {}", self.repository());
        let what = format!("blob {digest}");
        let mut backoff = self.backoff();
        loop {
            let stream = body()?;
            let attempt = async {
                let at = self.begin_upload(digest).await?;
                let watch = self.http.watch("PUT", &at, &what, size);
                let rb = self.request(Method::PUT, at.clone()).await?;
                let rb = rb
                    .header(CONTENT_LENGTH, size)
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .body(watch.body(stream, size));
                let resp = watch.send(rb).await?;
                if !resp.status().is_success() {
                    return Err(watch.status(resp).await);
                }
                Ok(())
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(f) if backoff.retry(&f).await => {}
                Err(f) => return Err(self.error(&op, f, backoff.attempts())),
            }
        }
    }

    /// Upload the small blob `data` (its digest computed here).
    pub(crate) async fn push_blob_bytes(&self, data: Vec<u8>) -> Result<(), RegistryError> {
        let digest = digest_of(&data);
        let data = Bytes::from(data);
        let size = data.len() as u64;
        self.upload(&digest, size, || {
            Ok(futures_util::stream::iter([Ok(data.clone())]))
        })
        .await
    }

    /// `PUT` the OCI manifest `bytes` under `reference` (a tag or its
    /// digest).
    pub(crate) async fn push_manifest(
        &self,
        reference: &Reference,
        bytes: Vec<u8>,
    ) -> Result<(), RegistryError> {
        let op = format!("push manifest {reference}");
        let url = self.manifest_url(reference)?;
        let what = format!("manifest {reference}");
        let bytes = Bytes::from(bytes);
        self.retrying(&op, || async {
            let size = bytes.len() as u64;
            let watch = self.http.watch("PUT", &url, &what, size);
            let rb = self.request(Method::PUT, url.clone()).await?;
            let chunk = futures_util::stream::iter([Ok(bytes.clone())]);
            let rb = rb
                .header(CONTENT_TYPE, OCI_MANIFEST_MEDIA_TYPE)
                .header(CONTENT_LENGTH, size)
                .body(watch.body(chunk, size));
            let resp = watch.send(rb).await?;
            if !resp.status().is_success() {
                return Err(watch.status(resp).await);
            }
            Ok(())
        })
        .await
    }

    /// `GET` the OCI manifest `reference` (a tag or a digest): its bytes
    /// and digest. At most [`MAX_OCI_MANIFEST_BYTES`], and at most
    /// `declared` bytes if a descriptor gave its size. A manifest fetched
    /// by digest must hash to it.
    pub(crate) async fn pull_manifest(
        &self,
        reference: &Reference,
        declared: Option<u64>,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        self.pull_manifest_accepting(reference, declared, OCI_MANIFEST_MEDIA_TYPE)
            .await
    }

    /// [`Registry::pull_manifest`] asking for the media types `accept` (an
    /// `Accept` header's value: an image index or a manifest, OCI or
    /// Docker's).
    pub(crate) async fn pull_manifest_accepting(
        &self,
        reference: &Reference,
        declared: Option<u64>,
        accept: &str,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let op = format!("fetch manifest {reference}");
        let url = self.manifest_url(reference)?;
        let what = format!("manifest from {reference}");
        let max = declared.map_or(MAX_OCI_MANIFEST_BYTES as u64, |d| {
            d.min(MAX_OCI_MANIFEST_BYTES as u64)
        });
        let body = self
            .retrying(&op, || async {
                let watch = self.http.watch("GET", &url, &what, max);
                let rb = self.request(Method::GET, url.clone()).await?;
                let mut resp = watch.send(rb.header(ACCEPT, accept)).await?;
                if resp.status() != StatusCode::OK {
                    return Err(watch.status(resp).await);
                }
                watch.read_capped(&mut resp, max).await
            })
            .await?;
        let found = digest_of(&body);
        if let Some(want) = reference.digest() {
            if found != want {
                return Err(RegistryError::Artifact {
                    what: reference.to_string(),
                    msg: format!("manifest has digest {found}, expected {want}"),
                });
            }
        }
        Ok((body, found))
    }

    /// Start downloading the blob `digest`, declared `size` bytes long;
    /// `what` names it in failures. One attempt: a caller that retries
    /// starts again from the blob's first byte.
    pub(crate) async fn blob(
        &self,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<BlobBody, Failure> {
        let url = self.blob_url(digest).map_err(|e| Failure {
            request: "GET".into(),
            kind: Kind::Fatal(e.to_string()),
        })?;
        let watch = self.http.watch("GET", &url, what, size);
        let rb = self.request(Method::GET, url).await?;
        let resp = watch.send(rb).await?;
        if resp.status() != StatusCode::OK {
            return Err(watch.status(resp).await);
        }
        let body = BlobBody {
            resp,
            watch,
            size,
            received: 0,
            what: what.to_string(),
        };
        if body.resp.content_length().is_some_and(|n| n > size) {
            return Err(body.too_large());
        }
        Ok(body)
    }

    /// Fetch a small blob (`size` bytes, already checked to be small) into
    /// memory; `op` names it in errors. Its digest is the caller's to check.
    pub(crate) async fn small_blob(
        &self,
        digest: &str,
        size: u64,
        op: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        let what = format!("blob {digest}");
        self.retrying(op, || async {
            let mut b = self.blob(digest, size, &what).await?;
            let mut out = Vec::new();
            while let Some(c) = b.chunk().await? {
                out.extend_from_slice(&c);
            }
            Ok(out)
        })
        .await
    }
}

/// A blob's body being received, never more than its declared size.
pub(crate) struct BlobBody {
    resp: Response,
    watch: Watch,
    size: u64,
    received: u64,
    what: String,
}

impl BlobBody {
    fn too_large(&self) -> Failure {
        self.watch.fail(Kind::Transfer(TransferProblem::TooLarge {
            what: self.what.clone(),
            max: self.size,
            declared: true,
        }))
    }

    /// The next bytes, `None` at the end of the body (which may come before
    /// the declared size: the digest check tells).
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, Failure> {
        let c = self.watch.chunk(&mut self.resp).await?;
        if let Some(b) = &c {
            self.received += b.len() as u64;
            if self.received > self.size {
                return Err(self.too_large());
            }
        }
        Ok(c)
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

    #[test]
    fn bearer_challenges() {
        let (realm, service) = bearer_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a:pull""#,
        )
        .unwrap();
        assert_eq!(realm, "https://auth.example/token");
        assert_eq!(service.as_deref(), Some("registry.example"));
        assert!(bearer_challenge(r#"Basic realm="x""#).is_none());
        assert!(bearer_challenge(r#"Bearer service="no realm""#).is_none());
        let s = scopes("a/b", true, Some(&parse_reference("r:1/c/d").unwrap()));
        assert_eq!(s, ["repository:a/b:pull,push", "repository:c/d:pull"]);
    }
}
