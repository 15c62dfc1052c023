"""A throwaway OCI registry on 127.0.0.1: Debian's `docker-registry` (CNCF
distribution 2.8), with its storage in a directory of ours and, optionally,
htpasswd basic auth. For the `vmstore push`/`pull` tests and benchmark.

    with LocalRegistry(tmp / "reg") as reg:
        vmstore(store, "push", "golden", f"{reg.host}/sandboxes/py:v1", "--plain-http")
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def registry_bin() -> Path:
    """The registry the tests serve: $IGNITION_REGISTRY, else Debian's `docker-registry`
    (scripts/setup.sh installs it), else a `registry` on PATH (CNCF distribution's own binary;
    on a Mac: `go install github.com/distribution/distribution/v3/cmd/registry@v3.0.0`)."""
    if env := os.environ.get("IGNITION_REGISTRY"):
        return Path(env)
    debian = Path("/usr/bin/docker-registry")
    found = shutil.which("registry")
    return debian if debian.is_file() or found is None else Path(found)


REGISTRY_BIN = registry_bin()
"""The registry binary (registry_bin()); a missing one skips the registry tests."""
START_TIMEOUT_S = 20.0
"""How long the registry may take to answer its first request."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def htpasswd_line(user: str, password: str) -> str:
    """One htpasswd line with a bcrypt hash (the only kind distribution accepts)."""
    try:
        import bcrypt

        return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()}"
    except ImportError:
        out = subprocess.run(["htpasswd", "-nbB", user, password], capture_output=True, text=True, check=True)
        return out.stdout.strip()


def auth_file(path: Path, host: str, user: str, password: str) -> Path:
    """Writes a docker-style auth file (`auths` map, base64 `auth` field) for host; returns path."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def make_tls(root: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for IP 127.0.0.1 signed by it (openssl);
    returns (ca.pem, cert.pem, key.pem)."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ignition-test-ca")
    ssl("req", *ec, "-keyout", "key.pem", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (root / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    ssl(
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )
    return root / "ca.pem", root / "cert.pem", root / "key.pem"


class LocalRegistry:
    """`docker-registry serve CONFIG` on a free port of 127.0.0.1, storage under root/data.
    With `users` ({name: password}), htpasswd basic auth; with `token` (a TokenServer), bearer
    tokens from it; with `tls`, HTTPS with a certificate
    from a throwaway CA (self.ca: trust it with SSL_CERT_FILE). Stopped (and its process reaped)
    on exit."""

    def __init__(
        self, root: Path, users: dict[str, str] | None = None, tls: bool = False, token: TokenServer | None = None
    ):
        self.root = Path(root)
        self.users = users or {}
        self.tls = tls
        self.token = token
        self.ca: Path | None = None
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def blobs(self) -> Path:
        """Where distribution's filesystem driver keeps blobs: blobs/sha256/XX/HEX/data."""
        return self.root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"

    def blob_path(self, digest: str) -> Path:
        """The stored bytes of the blob `sha256:HEX`."""
        hexd = digest.split(":", 1)[1]
        return self.blobs / hexd[:2] / hexd / "data"

    def start(self) -> LocalRegistry:
        if not REGISTRY_BIN.is_file():
            raise FileNotFoundError(
                f"{REGISTRY_BIN} missing: scripts/setup.sh installs Debian's docker-registry (README: Mac users)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        lines = [
            "version: 0.1",
            "log:",
            "  level: warn",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.root / 'data'}",
            "http:",
            f"  addr: {self.host}",
        ]
        if self.tls:
            self.ca, cert, key = make_tls(self.root)
            lines += ["  tls:", f"    certificate: {cert}", f"    key: {key}"]
        if self.users:
            pw = self.root / "htpasswd"
            pw.write_text("".join(htpasswd_line(u, p) + "\n" for u, p in self.users.items()))
            lines += ["auth:", "  htpasswd:", "    realm: ignition-test", f"    path: {pw}"]
        elif self.token:
            lines += self.token.config_lines()
        scheme, context = "http", None
        if self.tls:
            scheme, context = "https", ssl.create_default_context(cafile=str(self.ca))
        config = self.root / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        with open(self.root / "registry.log", "wb") as log:
            self.proc = subprocess.Popen(
                [str(REGISTRY_BIN), "serve", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{scheme}://{self.host}/v2/", timeout=2, context=context).close()
                return self
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"registry on {self.host} did not start: {(self.root / 'registry.log').read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wipe(self) -> None:
        """Stops the registry and removes its storage."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def environ_with_auth(path: Path | None) -> dict[str, str]:
    """os.environ with REGISTRY_AUTH_FILE set to path (or removed), and no other auth file found."""
    env = dict(os.environ)
    env.pop("DOCKER_CONFIG", None)
    if path is None:
        env.pop("REGISTRY_AUTH_FILE", None)
        env["HOME"] = "/nonexistent"
    else:
        env["REGISTRY_AUTH_FILE"] = str(path)
    return env


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _der_ecdsa_to_raw(der: bytes) -> bytes:
    """An ECDSA signature from DER (SEQUENCE of two INTEGERs) to JWS's r || s, 32 bytes each."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7F)
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        n = der[i + 1]
        out += der[i + 2 : i + 2 + n].lstrip(b"\0").rjust(32, b"\0")
        i += 2 + n
    return out


class TokenServer:
    """A token server for distribution's bearer-token authentication (distribution's
    `token.md`): a client that presents `users`' basic credentials at GET /token gets a JWT
    (ES256, signed with openssl, the signing certificate in its x5c header) granting what it
    asked for. Serve it with LocalRegistry(token=server)."""

    SERVICE = "ignition-test-registry"
    ISSUER = "ignition-test-issuer"

    def __init__(self, root: Path, users: dict[str, str]):
        import http.server
        import threading
        import urllib.parse

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.users = users
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "token.key",
                "-out",
                "token.pem",
                "-days",
                "2",
                "-subj",
                "/CN=ignition-test-token",
            ],
            cwd=self.root,
            check=True,
            capture_output=True,
        )
        self.cert = self.root / "token.pem"
        der = subprocess.run(
            ["openssl", "x509", "-in", "token.pem", "-outform", "DER"], cwd=self.root, check=True, capture_output=True
        ).stdout
        self.x5c = base64.b64encode(der).decode()
        self.issued: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read the registry's log, not this one."""

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(url.query)
                auth = self.headers.get("Authorization", "")
                who = None
                if auth.startswith("Basic "):
                    user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
                    if server.users.get(user) == pw:
                        who = user
                if url.path != "/token" or who is None:
                    self.send_response(401)
                    self.end_headers()
                    return
                token = server.token(who, q.get("scope", []))
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def token(self, user: str, scopes: list[str]) -> str:
        access = []
        for scope in " ".join(scopes).split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [self.x5c]}
        claims = {
            "iss": self.ISSUER,
            "sub": user,
            "aud": self.SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": os.urandom(8).hex(),
            "access": access,
        }
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        der = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.root / "token.key")],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
        ).stdout
        self.issued.append(user)
        return f"{signing_input}.{_b64url(_der_ecdsa_to_raw(der))}"

    def config_lines(self) -> list[str]:
        return [
            "auth:",
            "  token:",
            f"    realm: {self.realm}",
            f"    service: {self.SERVICE}",
            f"    issuer: {self.ISSUER}",
            f"    rootcertbundle: {self.cert}",
        ]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
