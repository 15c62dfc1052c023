"""A registry on 127.0.0.1 that attacks its client, for the tests of `vmstore push`/`pull`'s limits.

It is an honest registry in memory (the distribution-spec endpoints `vmstore` uses: `GET /v2/`, a
blob's `HEAD` and `GET`, an upload by `POST` then one `PUT`, a manifest's `PUT` and `GET` by tag or
digest; optionally bearer tokens from its own `/token`) until told to misbehave on one kind of
request:

    with HostileRegistry() as reg:
        vmstore(store, "push", "d1", f"{reg.host}/x/py:v1", "--plain-http")    # honest
        reg.attack("endless", on="manifest-get")
        vmstore(other, "pull", f"{reg.host}/x/py:v1", "--plain-http")           # must fail, bounded

Request kinds (`on`): version (`GET /v2/`), token, manifest-get, manifest-put, blob-head, blob-get,
upload-start (`POST .../blobs/uploads/`), upload-put. Attacks (`ATTACKS`): see each one's note there.
Every request is logged in `requests` as (kind, path) for the tests' counts.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import urllib.parse
import uuid
from typing import Any

ATTACKS = {
    "endless": "200 with a chunked body that never ends",
    "huge-length": "200 with Content-Length: 10^12, then bytes until the client goes",
    "endless-error": "the attack's status (500 by default) with a chunked body that never ends",
    "silent": "reads the request, never answers (the connection stays open)",
    "drip": "200 with a plausible Content-Length, then one byte a second",
    "redirect-loop": "307 to the same path under another query, forever",
    "wrong-bytes": "the blob's length, other bytes",
    "longer": "the blob's bytes, then more, chunked, without end",
    "skippable-frames": "zstd skippable frames without end: a zstd stream that never yields a byte",
    "fail-once": "the first request of the kind gets the attack's status (503 by default), later ones honest",
    "cut-once": "the first request of the kind gets half its body, then the connection closes",
}
"""The attacks, each with what the server does to a request of the attacked kind."""

PIECE = b"x" * 65536
"""What endless bodies are made of."""
TOKEN = "hostile-test-token"
"""The bearer token `/token` hands out when the registry asks for tokens."""
_PATH = re.compile(r"^/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")
_UPLOAD = re.compile(r"^/v2/(?P<repo>.+)/blobs/uploads/(?P<id>[^/]*)$")


class HostileRegistry:
    """The server, on a free port of 127.0.0.1 (`host`), stopped on exit. With `tokens`, every request
    but `/token` needs `Authorization: Bearer TOKEN` and is otherwise answered 401 with a bearer
    challenge naming `/token` on this server."""

    def __init__(self, tokens: bool = False):
        self.tokens = tokens
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.kind: str | None = None
        self.on: str | None = None
        self.digest: str | None = None
        self.status = 500
        self.fired = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileRegistry:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def attack(self, kind: str, on: str, digest: str | None = None, status: int | None = None) -> None:
        """Misbehave with `kind` (one of ATTACKS) on requests of kind `on` (for blob requests, only
        the blob `digest` if given); `status` for endless-error (default 500) and fail-once (503)."""
        assert kind in ATTACKS, kind
        with self.lock:
            self.kind, self.on, self.digest, self.fired = kind, on, digest, 0
            self.status = status or (503 if kind == "fail-once" else 500)

    def honest(self) -> None:
        """Stop misbehaving."""
        with self.lock:
            self.kind = self.on = self.digest = None

    def count(self, kind: str, digest: str | None = None) -> int:
        """Requests of `kind` received (for the blob or manifest `digest` if given)."""
        with self.lock:
            return sum(1 for k, p in self.requests if k == kind and (digest is None or p.endswith("/" + digest)))

    def manifest(self, repo: str, ref: str) -> dict[str, Any]:
        """The stored manifest `repo:ref`, parsed."""
        parsed: dict[str, Any] = json.loads(self.manifests[(repo, ref)])
        return parsed

    def put_manifest(self, repo: str, ref: str, manifest: dict[str, Any]) -> str:
        """Stores `manifest` under `repo:ref` and its digest; returns the digest."""
        body = json.dumps(manifest).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.manifests[(repo, ref)] = self.manifests[(repo, digest)] = body
        return digest

    def armed(self, kind: str, path: str) -> str | None:
        """The attack to make on this request, if any (and counts it)."""
        with self.lock:
            self.requests.append((kind, path))
            if self.kind is None or self.on != kind or (self.digest and not path.endswith("/" + self.digest)):
                return None
            self.fired += 1
            if self.kind in ("fail-once", "cut-once") and self.fired > 1:
                return None
            return self.kind


def _handler(reg: HostileRegistry) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests count requests in `requests`."""

        # -- answers --------------------------------------------------------------------------
        def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def error(self, status: int, code: str) -> None:
            body = json.dumps({"errors": [{"code": code, "message": code.lower().replace("_", " ")}]})
            self.answer(status, body.encode(), {"Content-Type": "application/json"})

        def stream_forever(self, status: int, piece: bytes, chunked: bool = True, length: int | None = None) -> None:
            """`status`, then `piece` again and again until the client goes or the server stops."""
            self.send_response(status)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            try:
                while not reg.stopping.is_set():
                    if chunked:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    else:
                        self.wfile.write(piece)
            except OSError:
                pass
            self.close_connection = True

        def misbehave(self, attack: str, body: bytes) -> None:
            """Do `attack` to this request, whose honest answer is 200 with `body`."""
            if attack == "endless":
                self.stream_forever(200, PIECE)
            elif attack == "huge-length":
                self.stream_forever(200, PIECE, chunked=False, length=10**12)
            elif attack == "endless-error":
                self.stream_forever(reg.status, b'{"errors":[{"code":"UNKNOWN","message":"' + PIECE)
            elif attack == "skippable-frames":
                # A zstd skippable frame (magic 0x184D2A50, little-endian length) of 64 KiB.
                self.stream_forever(200, b"\x50\x2a\x4d\x18" + len(PIECE).to_bytes(4, "little") + PIECE)
            elif attack == "silent":
                reg.stopping.wait()
                self.close_connection = True
            elif attack == "drip":
                self.send_response(200)
                self.send_header("Content-Length", str(max(len(body), 1000)))
                self.end_headers()
                try:
                    while not reg.stopping.wait(1.0):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True
            elif attack == "redirect-loop":
                self.answer(307, b"", {"Location": self.path.split("?")[0] + f"?loop={uuid.uuid4().hex}"})
            elif attack == "wrong-bytes":
                self.answer(200, bytes(b ^ 0x55 for b in body))
            elif attack == "longer":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
                    while not reg.stopping.is_set():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(PIECE), PIECE))
                except OSError:
                    pass
                self.close_connection = True
            elif attack == "fail-once":
                self.error(reg.status, "UNAVAILABLE")
            elif attack == "cut-once":
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
            else:
                raise AssertionError(attack)

        # -- requests -------------------------------------------------------------------------
        def authorized(self, kind: str) -> bool:
            if not reg.tokens or kind == "token" or self.headers.get("Authorization") == f"Bearer {TOKEN}":
                return True
            realm = f"http://{reg.host}/token"
            challenge = f'Bearer realm="{realm}",service="hostile-test-registry"'
            self.error_with(401, "UNAUTHORIZED", {"WWW-Authenticate": challenge})
            return False

        def error_with(self, status: int, code: str, headers: dict[str, str]) -> None:
            body = json.dumps({"errors": [{"code": code, "message": code.lower()}]}).encode()
            self.answer(status, body, {"Content-Type": "application/json", **headers})

        def route(self) -> tuple[str, dict[str, str]]:
            """The request's kind and its path's parts."""
            path = self.path.split("?")[0]
            if path in ("/v2/", "/v2"):
                return "version", {}
            if path == "/token":
                return "token", {}
            m = _UPLOAD.match(path)
            if m:
                return ("upload-start" if self.command == "POST" else "upload-put"), m.groupdict()
            m = _PATH.match(path)
            if m:
                what = "manifest" if m["kind"] == "manifests" else "blob"
                verb = {"GET": "get", "HEAD": "head", "PUT": "put"}.get(self.command, "other")
                return f"{what}-{verb}", m.groupdict()
            return "other", {}

        def handle_one(self) -> None:
            kind, parts = self.route()
            attack = reg.armed(kind, self.path.split("?")[0])
            if not self.authorized(kind):
                return
            body = self.read_body()
            honest = self.honest_body(kind, parts)
            if attack is not None:
                self.misbehave(attack, honest[1] if honest else b"")
                return
            self.honest_answer(kind, parts, body)

        def honest_body(self, kind: str, parts: dict[str, str]) -> tuple[str, bytes] | None:
            if kind in ("blob-get", "blob-head") and parts["ref"] in reg.blobs:
                return "application/octet-stream", reg.blobs[parts["ref"]]
            if kind == "manifest-get" and (parts["repo"], parts["ref"]) in reg.manifests:
                return "application/vnd.oci.image.manifest.v1+json", reg.manifests[(parts["repo"], parts["ref"])]
            if kind == "token":
                return "application/json", json.dumps({"token": TOKEN, "expires_in": 300}).encode()
            return None

        def honest_answer(self, kind: str, parts: dict[str, str], body: bytes) -> None:
            if kind == "version":
                self.answer(200, b"{}")
            elif kind in ("token", "blob-get", "blob-head", "manifest-get"):
                found = self.honest_body(kind, parts)
                if found is None:
                    self.error(404, "BLOB_UNKNOWN" if kind.startswith("blob") else "MANIFEST_UNKNOWN")
                    return
                media, data = found
                headers = {"Content-Type": media}
                if kind != "token":
                    headers["Docker-Content-Digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
                self.answer(200, data, headers)
            elif kind == "upload-start":
                mount = self.query().get("mount", "")
                if mount in reg.blobs:
                    self.answer(201, b"", {"Location": f"/v2/{parts['repo']}/blobs/{mount}"})
                    return
                self.answer(202, b"", {"Location": f"/v2/{parts['repo']}/blobs/uploads/{uuid.uuid4()}?_state=x"})
            elif kind == "upload-put":
                want = self.query().get("digest", "")
                if "sha256:" + hashlib.sha256(body).hexdigest() != want:
                    self.error(400, "DIGEST_INVALID")
                    return
                reg.blobs[want] = body
                self.answer(201, b"", {"Location": f"/v2/{parts['repo']}/blobs/{want}"})
            elif kind == "manifest-put":
                digest = "sha256:" + hashlib.sha256(body).hexdigest()
                reg.manifests[(parts["repo"], parts["ref"])] = reg.manifests[(parts["repo"], digest)] = body
                headers = {"Location": f"/v2/{parts['repo']}/manifests/{digest}", "Docker-Content-Digest": digest}
                self.answer(201, b"", headers)
            else:
                self.error(404, "UNSUPPORTED")

        def query(self) -> dict[str, str]:
            return {k: v[-1] for k, v in urllib.parse.parse_qs(self.path.partition("?")[2]).items()}

        def read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    n = int(self.rfile.readline().split(b";")[0], 16)
                    if n == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(n)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            self.handle_one()

        def do_HEAD(self) -> None:
            self.handle_one()

        def do_POST(self) -> None:
            self.handle_one()

        def do_PUT(self) -> None:
            self.handle_one()

    return Handler
