"""Fixtures for the feed tests: tiny photo-like images, packed shards, a real S3 server on loopback,
and `make`, the Loader of the test_loader_*.py specifications."""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from loader_helpers import SMALL, MakeLoader

from gpufeed.data.loader import Loader
from gpufeed.data.packing import pack
from gpufeed.data.source import filesystem
from gpufeed.demo.synth import make_image_folder

N_IMAGES = 48


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(
        tmp_path_factory.mktemp("images"), N_IMAGES, 4, short_side=(40, 64), quality=(85, 90)
    )


@pytest.fixture(scope="session")
def id_list(image_folder: Path) -> Path:
    """A list file giving every image its own label, so labels identify samples exactly."""
    paths = sorted(image_folder.glob("*/*.jpg"))
    lst = image_folder.parent / "ids.txt"
    lst.write_text("".join(f"{p} {i}\n" for i, p in enumerate(paths)))
    return lst


@pytest.fixture(scope="session")
def shards(id_list: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 samples (label = sample id) in 7 uneven shards."""
    out = tmp_path_factory.mktemp("shards")
    with pytest.warns(UserWarning, match="outside 1-128 MB"):
        pack(id_list, out, shard_size="16KB", workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 (real HTTP, real S3 protocol), with dummy credentials."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_server,
    }.items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def s3_shards(s3_env: str, id_list: Path) -> str:
    """48 samples in 7 shards in a new bucket of the moto server (written without faults)."""
    bucket = f"bucket-{uuid.uuid4().hex[:12]}"
    filesystem("s3://x").mkdir(bucket)
    url = f"s3://{bucket}/train"
    with pytest.warns(UserWarning, match="outside 1-128 MB"):
        pack(id_list, url, shard_size="16KB", workers=1, progress=False)
    return url


class FaultyProxy:
    """A loopback HTTP proxy in front of the S3 server that fails some shard GETs for real:
    every `every`-th ranged GET of a .tar object alternately gets an HTTP 500 or a TCP reset, and
    every one gets a 503 while `down_until` (time.monotonic()) has not passed: an outage."""

    def __init__(self, upstream: str, every: int = 3) -> None:
        self.upstream = upstream.split("://", 1)[1]
        self.every, self.gets, self.injected = every, 0, {"500": 0, "reset": 0}
        self.down_until = 0.0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy._fault(self.command, self.path)
                if fault == "reset":
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault in ("500", "503"):
                    msg = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    self.send_response(int(fault))
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = self.headers.get("Host", proxy.upstream)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _fault(self, method: str, path: str) -> str | None:
        if method != "GET" or ".tar" not in path:
            return None
        if time.monotonic() < self.down_until:
            return "503"
        with self.lock:
            self.gets += 1
            if self.gets % self.every:
                return None
            kind = "500" if (self.gets // self.every) % 2 else "reset"
            self.injected[kind] += 1
            return kind

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def faulty_proxy(s3_server: str):
    proxy = FaultyProxy(s3_server)
    yield proxy
    proxy.close()


@pytest.fixture(scope="session")
def corrupt_shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """11 samples in one shard: 10 good ones (label 0) and, last in pack order, a truncated JPEG
    (label 1) whose header reads fine but whose scan data ends early."""
    src = tmp_path_factory.mktemp("corrupt_src")
    good = sorted(image_folder.glob("*/*.jpg"))[:10]
    lines = [f"{p} 0" for p in good]
    bad = src / "bad.jpg"
    data = good[0].read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    lines.append("bad.jpg 1")
    (src / "list.txt").write_text("\n".join(lines))
    out = tmp_path_factory.mktemp("corrupt_shards")
    pack(src / "list.txt", out, workers=1, progress=False)
    return out


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def make() -> Iterator[MakeLoader]:
    """`make(data, batch_size, **options)`: a Loader (tiny images by default), closed after the
    test, so no feeder thread of one test is running when the next forks its workers."""
    made: list[Loader] = []

    def new(data: Path, batch_size: int, **kw: Any) -> Loader:
        kw.setdefault("augment", SMALL)
        kw.setdefault("device", "cpu")
        loader = Loader(data, batch_size, **kw)
        made.append(loader)
        return loader

    yield new
    for loader in made:
        loader.close()
