"""Shards on a real S3-protocol server (moto on loopback): pack to S3, stream back, retries, cache."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from indexes import index_doc
from processes import wait_until

from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.packing import PackError, pack
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.shards import INDEX_NAME, ShardEntry, ShardError
from gpufeed.data.source import (
    Destination,
    Source,
    _writer_host,
    filesystem,
    remove_partial_files,
)
from gpufeed.errors import OptionError

SMALL = Augment(size=(16, 16))


@pytest.fixture
def bucket(s3_env: str) -> str:
    fs = filesystem("s3://x")
    name = f"bucket-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture
def s3_shards(bucket: str, id_list: Path) -> str:
    url = f"{bucket}/train"
    with pytest.warns(UserWarning):
        pack(id_list, url, shard_size="16KB", workers=1, progress=False)
    return url


def _labels(loader: Loader) -> list[int]:
    return [int(x) for _, y in loader for x in y]


@pytest.fixture
def make() -> Iterator[Callable[..., Loader]]:
    """`make(url, batch_size, **options)`: a Loader closed after the test. A Loader left to the
    garbage collector may be finalized on fsspec's I/O thread, whose reads its own feeder thread
    waits for (see test_loader's close tests)."""
    made: list[Loader] = []

    def new(*args: Any, **kw: Any) -> Loader:
        kw.setdefault("augment", SMALL)
        made.append(Loader(*args, **kw))
        return made[-1]

    yield new
    for loader in made:
        loader.close()


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_streamed_from_s3_every_sample_exactly_once(
    s3_shards: str, make: Callable[..., Loader], world: int, workers: int
):
    seen = []
    for rank in range(world):
        loader = make(
            s3_shards, 5, num_workers=workers, rank=rank, world_size=world, chunk_size=4096
        )
        seen += _labels(loader)
    assert sorted(seen) == list(range(48))


def test_resume_mid_epoch_from_s3(s3_shards: str, make: Callable[..., Loader]):
    loader = make(s3_shards, 4, num_workers=2)
    first = []
    for i, (_, y) in enumerate(loader):
        first += y.tolist()
        if i == 2:
            state = loader.state_dict()
            break
    resumed = make(s3_shards, 4, num_workers=2)
    resumed.load_state_dict(state)
    assert sorted(first + _labels(resumed)) == list(range(48))


def test_injected_500s_and_connection_resets_are_retried_without_loss_or_duplicates(
    s3_shards: str, faulty_proxy, monkeypatch: pytest.MonkeyPatch, make: Callable[..., Loader]
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    # botocore's and s3fs's own retries off, so gpufeed's retry layer has to carry every failure
    opts = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}
    loader = make(s3_shards, 5, num_workers=0, chunk_size=4096, storage_options=opts)
    filesystem(s3_shards, opts).retries = 1
    assert sorted(_labels(loader)) == list(range(48))
    assert faulty_proxy.injected["500"] > 0 and faulty_proxy.injected["reset"] > 0
    assert loader.stats()["retried"] > 0


def test_an_outage_longer_than_the_retries_but_within_the_deadline_is_ridden_out(
    s3_shards: str, faulty_proxy, monkeypatch: pytest.MonkeyPatch
):
    # 1 retry 50 ms apart used to end the epoch ~0.1 s into an outage: once the endpoint has
    # answered, tries go on (pauses up to MAX_PAUSE) until the deadline
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faulty_proxy.every = 10**9  # no other faults
    opts = {"config_kwargs": {"retries": {"total_max_attempts": 1}}, "timeout": 60}
    source = Source(s3_shards, storage_options=opts, retries=1)
    entry = source.read_index().shards[0]
    assert len(source.open(entry, 0).read(1024)) == 1024  # the endpoint answers
    faulty_proxy.down_until = time.monotonic() + 2.0
    data = source.open(entry, 1024).read()
    assert len(data) == entry.bytes - 1024 and source.new_retries() >= 2


def test_cache_dir_keeps_verified_shards_for_later_epochs(
    s3_shards: str, tmp_path: Path, make: Callable[..., Loader]
):
    cache = tmp_path / "cache"
    loader = make(s3_shards, 8, num_workers=0, cache_dir=cache, shuffle=False)
    assert sorted(_labels(loader)) == list(range(48))
    loader.close()  # the last shard's file is closed once the stream moves on (see below)
    cached = sorted(p.name for p in cache.rglob("*.tar"))
    assert len(cached) == len(loader.dataset.index.shards)
    # later runs read from the cache: remove the remote shards and read again
    fs = filesystem(s3_shards)
    for e in loader.dataset.index.shards:
        fs.rm_file(f"{s3_shards}/{e.name}")
    again = make(s3_shards, 8, num_workers=0, cache_dir=cache, shuffle=False)
    assert sorted(_labels(again)) == list(range(48))


def test_an_epoch_read_to_its_end_has_cached_every_shard(s3_shards: str, tmp_path: Path):
    cache = tmp_path / "cache"
    ds = ShardDataset(s3_shards, shuffle=False, cache_dir=cache)
    plan = BatchPlan(ds, 8, 1, drop_last=False)
    stream = plan.worker_batches(0, Position(0, 0))
    labels = [s.label for _ in range(plan.batches) for s in next(stream)[1]]
    assert sorted(labels) == list(range(48))
    assert len(list(cache.rglob("*.tar"))) == len(ds.index.shards)


def test_an_unshuffled_epoch_read_by_several_workers_has_cached_every_shard(
    s3_shards: str, tmp_path: Path
):
    # each worker reads its own batches' runs: the one starting a shard reads on to its end
    cache = tmp_path / "cache"
    ds = ShardDataset(s3_shards, shuffle=False, cache_dir=cache)
    plan = BatchPlan(ds, 4, 3, drop_last=False)
    labels = []
    for w in range(3):
        stream = plan.worker_batches(w, Position(0, 0))
        labels += [s.label for _ in range(len(range(w, plan.batches, 3))) for s in next(stream)[1]]
    assert sorted(labels) == list(range(48))
    assert len(list(cache.rglob("*.tar"))) == len(ds.index.shards)


def test_a_reader_asks_for_no_byte_past_its_end_unless_it_keeps_a_cache_copy(
    s3_shards: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    asked: list[tuple[int, int]] = []
    source = Source(s3_shards, chunk_size=1024, read_ahead=3)
    fetch = source.fetch_range
    monkeypatch.setattr(
        source, "fetch_range", lambda e, a, b, *r: asked.append((a, b)) or fetch(e, a, b, *r)
    )
    entry = source.read_index().shards[0]
    upto = int(entry.offsets[2])
    with source.open(entry, 512, upto) as f:
        assert len(f.read()) == upto - 512
    assert asked and max(b for _, b in asked) == upto
    cached = Source(s3_shards, chunk_size=1024, cache_dir=tmp_path / "cache")
    with cached.open(entry, 0, upto) as f:
        Source.finish(f)
    assert [p.stat().st_size for p in (tmp_path / "cache").rglob("*.tar")] == [entry.bytes]


def test_a_run_that_stops_before_a_bad_offset_reads_its_own_samples(s3_shards: str):
    # the reader's end is the run's last image, not the next sample's offset in the index
    fs = filesystem(s3_shards)
    doc = index_doc(fs.cat_file(f"{s3_shards}/{INDEX_NAME}"))
    entry = doc["shards"][0]
    entry["offsets"][3] = entry["image_offsets"][2] + 512  # inside sample 2's image
    fs.pipe_file(f"{s3_shards}/{INDEX_NAME}", json.dumps(doc).encode())
    plan = BatchPlan(ShardDataset(s3_shards, shuffle=False), 3, 2, drop_last=False)
    at, samples = next(plan.worker_batches(0, Position(0, 0)))
    assert at == Position(0, 0) and [s.key for s in samples] == entry["keys"][:3]
    with pytest.raises(ShardError, match=r"shard-00000\.tar .*invalid header"):  # from sample 3
        next(plan.worker_batches(1, Position(0, 0)))


def _flip_a_byte_of_an_image(data: bytes, entry: ShardEntry) -> bytes:
    """The shard's bytes with one byte of its first image changed: only the SHA-256 can tell."""
    raw = bytearray(data)
    raw[int(entry.image_offsets[0]) + 100] ^= 0x55
    return bytes(raw)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_an_unshuffled_epoch_of_several_workers_still_checks_a_local_shards_checksum(
    shards: Path, tmp_path: Path, num_workers: int
):
    # the worker whose run starts the shard reads on to its end (Source.finish)
    data = tmp_path / "data"
    shutil.copytree(shards, data)
    entry = ShardDataset(data).index.shards[2]
    shard = data / entry.name
    shard.write_bytes(_flip_a_byte_of_an_image(shard.read_bytes(), entry))
    loader = Loader(data, 3, num_workers=num_workers, shuffle=False, augment=SMALL, device="cpu")
    with loader, pytest.raises(ShardError, match=rf"{entry.name}: its SHA-256 is"):
        for _ in loader:
            pass


def test_an_unshuffled_epoch_of_several_workers_checks_a_remote_shard_it_caches(
    s3_shards: str, tmp_path: Path
):
    fs = filesystem(s3_shards)
    entry = ShardDataset(s3_shards).index.shards[2]
    fs.pipe_file(
        f"{s3_shards}/{entry.name}",
        _flip_a_byte_of_an_image(fs.cat_file(f"{s3_shards}/{entry.name}"), entry),
    )
    plan = BatchPlan(ShardDataset(s3_shards, shuffle=False, cache_dir=tmp_path), 3, 2, False)
    with pytest.raises(ShardError, match=rf"{entry.name}: its SHA-256 is"):
        for w in range(2):
            for at, _ in plan.worker_batches(w, Position(0, 0)):
                if at.epoch:
                    break
    assert not [p for p in tmp_path.rglob("*") if entry.name in p.name]  # not cached


def test_a_reader_whose_cache_cannot_be_written_reads_only_its_run(
    s3_shards: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "afile").write_text("")
    source = Source(s3_shards, cache_dir=tmp_path / "afile" / "cache")
    asked: list[int] = []
    fetch = source.fetch_range
    monkeypatch.setattr(
        source, "fetch_range", lambda e, a, b, *r: asked.append(b) or fetch(e, a, b, *r)
    )
    entry = source.read_index().shards[0]
    upto = int(entry.image_offsets[1]) + int(entry.image_sizes[1])
    with pytest.warns(RuntimeWarning, match="cannot write"), source.open(entry, 0, upto) as f:
        assert len(f.read()) == upto
        Source.finish(f)  # nothing to verify or cache: no read on to the end
    assert max(asked) == upto


def test_a_cache_dir_that_cannot_be_written_streams_the_shards_uncached_saying_so_once(
    s3_shards: str, tmp_path: Path, make: Callable[..., Loader]
):
    (tmp_path / "afile").write_text("")  # cache_dir under a file: mkdir fails, as read-only does
    loader = make(s3_shards, 8, num_workers=0, cache_dir=tmp_path / "afile" / "cache")
    with pytest.warns(RuntimeWarning, match=r"afile/cache: cannot write .* uncached") as caught:
        assert sorted(_labels(loader)) == list(range(48))
    assert sum("cannot write" in str(w.message) for w in caught) == 1


def test_a_full_disk_under_the_cache_streams_the_shards_uncached(s3_shards: str, tmp_path: Path):
    # a real write error: a file-size limit of 4 kB (EFBIG) on a process reading 16 kB shards
    script = f"""
import resource, signal, warnings
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from gpufeed.data.dataset import ShardDataset
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ds = ShardDataset({s3_shards!r}, shuffle=False, cache_dir={str(tmp_path / "cache")!r})
    labels = sorted(s.label for s in ds.iter_worker(0, 1))
print(labels == list(range(48)), [str(w.message) for w in caught])
"""
    cp = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.startswith("True") and "cannot write (File too large)" in cp.stdout
    assert not list((tmp_path / "cache").rglob("*.tar*"))  # no partial copy left behind


def test_a_failed_fetch_is_reported_as_itself_not_as_a_corrupt_shard(
    s3_shards: str, tmp_path: Path
):
    source = Source(s3_shards, cache_dir=tmp_path / "cache")
    entry = source.read_index().shards[0]
    filesystem(s3_shards).rm_file(f"{s3_shards}/{entry.name}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = source.open(entry, 0)
        with pytest.raises(ShardError, match="is missing"):
            reader.read()
        reader.close()
    assert not [w for w in caught if "SHA-256" in str(w.message)]  # it said "corrupt"


def test_missing_s3_shard_is_a_clear_error(s3_shards: str):
    fs = filesystem(s3_shards)
    fs.rm_file(f"{s3_shards}/shard-00001.tar")
    ds = ShardDataset(s3_shards, shuffle=False)
    with pytest.raises(ShardError, match=r"shard-00001\.tar is missing"):
        list(ds.iter_worker(0, 1))


def test_truncated_s3_shard_is_a_clear_error(s3_shards: str):
    fs = filesystem(s3_shards)
    path = f"{s3_shards}/shard-00002.tar"
    fs.pipe_file(path, fs.cat_file(path)[:3000])
    ds = ShardDataset(s3_shards, shuffle=False, chunk_size=65536)
    with pytest.raises(ShardError, match=r"shard-00002\.tar is truncated"):
        list(ds.iter_worker(0, 1))


def test_repacking_to_s3_after_a_shard_was_deleted_packs_it_again(
    s3_shards: str, id_list: Path, make: Callable[..., Loader]
):
    filesystem(s3_shards).rm_file(f"{s3_shards}/shard-00001.tar")
    with pytest.warns(UserWarning):
        again = pack(id_list, s3_shards, shard_size="16KB", workers=1, progress=False)
    assert not again.already_packed
    assert "shard shard-00001.tar is missing" in again.repacked
    assert sorted(_labels(make(s3_shards, batch_size=8, shuffle=False))) == list(range(48))
    with pytest.warns(UserWarning):
        assert pack(id_list, s3_shards, shard_size="16KB", workers=1, progress=False).already_packed


def test_missing_s3_prefix_names_the_index(bucket: str):
    with pytest.raises(ShardError, match=r"nothing/gpufeed-index\.json not found"):
        ShardDataset(f"{bucket}/nothing")


# --- deadlines and clear errors (issue 12, item 3) ----------------------------------------------


@pytest.fixture
def refused_endpoint() -> str:
    """A loopback port nothing listens on: connections are refused."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def no_credentials(s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The moto endpoint with no credentials anywhere (and no instance metadata lookups)."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    for k in ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_env


def test_a_silent_endpoint_is_a_clear_error_after_the_deadline(
    s3_env: str, silent_endpoint: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", silent_endpoint)
    with pytest.raises(ShardError) as err:
        ShardDataset("s3://bucket/train", storage_options={"timeout": 1.5})
    msg = str(err.value)
    assert "s3://bucket/train/gpufeed-index.json" in msg and silent_endpoint in msg
    assert "no answer within 1.5 s" in msg and "timeout" in msg


def test_a_refused_endpoint_is_a_clear_error_naming_it(
    s3_env: str, refused_endpoint: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", refused_endpoint)
    with pytest.raises(ShardError, match=r"cannot connect .*refused") as err:
        ShardDataset("s3://bucket/train", storage_options={"timeout": 3})
    assert refused_endpoint in str(err.value) and "s3://bucket/train" in str(err.value)


def test_missing_bucket_is_named_not_retried(s3_env: str):
    src = Source("s3://no-such-bucket/train", storage_options={"timeout": 30})
    with pytest.raises(ShardError, match="the bucket does not exist") as err:
        src.read_index()
    assert s3_env in str(err.value) and "s3://no-such-bucket/train/gpufeed-index.json" in str(
        err.value
    )
    assert src.retried == 0


def test_missing_credentials_fail_at_once_with_what_to_set(no_credentials: str):
    src = Source("s3://some-bucket/train", storage_options={"timeout": 30})
    with pytest.raises(ShardError, match=r"no usable credentials.*AWS_ACCESS_KEY_ID") as err:
        src.read_index()
    assert no_credentials in str(err.value)
    assert src.retried == 0  # not transient: never retried


def test_timeout_option_must_be_a_positive_number():
    with pytest.raises(ShardError, match=r"storage_options timeout='soon'"):
        Source("s3://bucket/train", storage_options={"timeout": "soon"})
    with pytest.raises(ShardError, match=r"timeout=-1"):
        Source("s3://bucket/train", storage_options={"timeout": -1})


def test_retries_made_inside_botocore_are_counted(
    s3_shards: str, faulty_proxy, monkeypatch: pytest.MonkeyPatch, make: Callable[..., Loader]
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    loader = make(s3_shards, 5, num_workers=0, chunk_size=4096)
    assert sorted(_labels(loader)) == list(range(48))
    # every HTTP 500 is retried by botocore; a reset on a reused keep-alive connection is
    # re-sent by aiohttp itself, below botocore, and may not be seen as a retry
    assert faulty_proxy.injected["500"] > 0
    assert loader.stats()["retried"] >= faulty_proxy.injected["500"]
    assert filesystem(s3_shards).retried > 0  # counted inside botocore


def test_a_failed_upload_leaves_no_temporary_file(s3_env: str, tmp_path: Path):
    out = Destination("s3://no-such-bucket/train", storage_options={"timeout": 30})
    local = out.local_tmp("shard-00000.tar")
    Path(local).write_bytes(b"x" * 1000)
    with pytest.raises(ShardError, match="bucket does not exist"):
        out.put_file(local, "shard-00000.tar")
    assert not Path(local).exists()


def test_pack_to_s3_errors_are_one_clear_line_and_leak_nothing(
    s3_env: str,
    refused_endpoint: str,
    image_folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with pytest.raises(PackError, match=r"s3://no-such-bucket/x at .*bucket does not exist"):
        pack(image_folder, "s3://no-such-bucket/x", workers=1, progress=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", refused_endpoint)
    with pytest.raises(PackError, match=r"cannot connect"):
        pack(
            image_folder,
            "s3://b/x",
            workers=1,
            progress=False,
            storage_options={"timeout": 2},
        )
    assert list(tmp.iterdir()) == []


def test_an_s3_filesystem_pickles_with_its_timeouts_and_retry_policy(s3_env: str):
    fs = filesystem("s3://bucket", {"timeout": 5})
    copy = pickle.loads(pickle.dumps(fs))
    assert type(copy) is type(fs) and copy.retries == 1
    assert copy.config_kwargs["read_timeout"] == 5 and copy.config_kwargs["connect_timeout"] == 5


@pytest.mark.parametrize("url", ["s3://", "s3:///", "s3:///prefix", "gs://"])
def test_a_url_without_a_bucket_is_a_clear_error_and_writes_nothing(
    url: str, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    scheme = url.split("://")[0]
    with pytest.raises(PackError, match=rf"{url} names no bucket: give {scheme}://BUCKET"):
        pack(image_folder, url, workers=1, progress=False)
    with pytest.raises(ShardError, match="names no bucket"):
        Source(url)
    with pytest.raises(ShardError, match="names no bucket"):
        Destination(url)
    assert list(tmp_path.iterdir()) == []  # no local folder `s3:` taken for the bucket


@pytest.mark.parametrize(
    ("url", "meant"), [("s3:/bkt/x", "s3://bkt/x"), ("s3:bkt/x", "s3://bkt/x")]
)
def test_a_url_missing_its_slashes_is_not_taken_for_a_local_folder(
    url: str, meant: str, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # `pack SRC s3:/bkt/x` packed into ./s3:/bkt/x and said "wrote ... to s3:/bkt/x"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PackError, match=rf"{url} looks like a mistyped URL .*: write {meant}, "):
        pack(image_folder, url, workers=1, progress=False)
    with pytest.raises(ShardError, match="looks like a mistyped URL"):
        Source(url)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / url).mkdir(parents=True)  # a local folder of that name: taken as it is
    assert Destination(url).url == url


def test_cache_dir_is_a_folder_with_home_expanded(shards: Path, monkeypatch):
    with pytest.raises(OptionError, match=r"cache_dir='': give a folder"):
        Source(shards, cache_dir="")
    monkeypatch.setenv("HOME", str(shards.parent))
    assert Source(shards, cache_dir="~/cache").cache_dir == shards.parent / "cache"


# --- refused access, a failing endpoint, bad storage_options, per-Loader retries, partial files --


@pytest.fixture
def refusing_endpoint() -> Iterator[Callable[[int, str], str]]:
    """`refusing_endpoint(status, code)`: the URL of an endpoint on 127.0.0.1 that answers every
    request with that S3 error, as S3 answers credentials without access or an expired token."""
    servers: list[ThreadingHTTPServer] = []

    def start(status: int, code: str) -> str:
        body = f"<Error><Code>{code}</Code><Message>refused</Message></Error>".encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _refuse(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _refuse

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "code"), [(403, "AccessDenied"), (400, "ExpiredToken")])
def test_refused_access_to_a_shard_is_one_error_naming_the_url_and_the_endpoint(
    s3_shards: str, refusing_endpoint: Callable[[int, str], str], status: int, code: str
):
    # it was a bare PermissionError
    entry = Source(s3_shards).read_index().shards[0]
    endpoint = refusing_endpoint(status, code)
    denied = Source(s3_shards, storage_options={"client_kwargs": {"endpoint_url": endpoint}})
    with pytest.raises(ShardError, match=rf"access denied \({status} {code}\)") as err:
        denied.open(entry).read()
    assert f"cannot read {s3_shards}/{entry.name} at {endpoint}: " in str(err.value)
    assert denied.retried == 0  # not transient: never retried


def test_refused_access_to_the_index_names_the_endpoint(
    s3_shards: str, refusing_endpoint: Callable[[int, str], str]
):
    endpoint = refusing_endpoint(403, "AccessDenied")
    denied = Source(s3_shards, storage_options={"client_kwargs": {"endpoint_url": endpoint}})
    with pytest.raises(ShardError, match=r"access denied \(403") as err:
        denied.read_index()
    assert f"cannot read {s3_shards}/{INDEX_NAME} at {endpoint}: " in str(err.value)


def test_an_expired_token_on_the_index_is_a_bad_request_not_retried(
    s3_shards: str, refusing_endpoint: Callable[[int, str], str]
):
    # S3 answers a HEAD with an expired session token by a bare 400 (no body, so no code):
    # s3fs makes it "OSError: [Errno 22] Bad Request", which was retried until the deadline
    endpoint = refusing_endpoint(400, "ExpiredToken")
    source = Source(
        s3_shards, storage_options={"client_kwargs": {"endpoint_url": endpoint}, "timeout": 60}
    )
    with pytest.raises(ShardError, match=r"bad request \(400") as err:
        source.read_index()
    assert "expired credentials" in str(err.value) and "AWS_REGION" in str(err.value)
    assert source.retried == 0


def test_storage_options_may_be_any_mapping(s3_shards: str):
    # a Hydra/OmegaConf DictConfig is a Mapping, not a dict: it was refused
    class Config(Mapping):
        def __init__(self, **options: Any) -> None:
            self._options = options

        def __getitem__(self, key: str) -> Any:
            return self._options[key]

        def __iter__(self) -> Iterator[str]:
            return iter(self._options)

        def __len__(self) -> int:
            return len(self._options)

    source = Source(s3_shards, storage_options=Config(timeout=60, config_kwargs=Config()))
    assert source.storage_options == {"timeout": 60, "config_kwargs": {}}
    assert len(source.read_index().shards) > 0


def test_an_endpoint_failing_until_the_deadline_is_reported_by_its_last_answer(
    s3_shards: str, faulty_proxy, monkeypatch: pytest.MonkeyPatch
):
    # the deadline cut the last try short, so 503s read "no answer; check that it is up"
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faulty_proxy.every = 10**9  # no other faults
    opts = {"config_kwargs": {"retries": {"total_max_attempts": 1}}, "timeout": 4}
    source = Source(s3_shards, storage_options=opts)
    entry = source.read_index().shards[0]  # the endpoint answers
    faulty_proxy.down_until = math.inf  # then answers 503 to every shard read
    with pytest.raises(ShardError) as err:
        source.open(entry).read()
    msg = str(err.value)
    assert f"{s3_shards}/{entry.name} at {faulty_proxy.url}: " in msg
    assert "still failing at the 4 s deadline (last answer: 503 InternalError" in msg
    assert "no answer" not in msg and source.retried > 0


def test_an_endpoint_answering_503_inside_botocores_own_retries_is_not_called_silent(
    s3_shards: str, faulty_proxy, monkeypatch: pytest.MonkeyPatch
):
    # botocore's default retries sleep up to seconds between 503s: a short deadline passes
    # while it sleeps, and the error said "no answer; check that the endpoint is up"
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faulty_proxy.every = 10**9
    source = Source(s3_shards, storage_options={"timeout": 60})
    entry = source.read_index().shards[0]  # with time to spare on a busy machine
    source.timeout = 1.5  # then a deadline shorter than botocore's pauses between its retries
    faulty_proxy.down_until = math.inf
    with pytest.raises(ShardError) as err:
        source.open(entry).read()
    msg = str(err.value)
    assert "still failing at the 1.5 s deadline (last answer: 503 InternalError" in msg
    assert "no answer" not in msg


@pytest.mark.parametrize(
    "options", ["timeout=5", ["timeout", 5], {"client_kwargs": "x"}, {"config_kwargs": 3}]
)
def test_storage_options_that_are_not_dicts_are_refused_naming_them(options: Any):
    # an AttributeError, a ValueError from deep inside, or an error only at the first read
    with pytest.raises(OptionError, match=r"^storage_options.*: give a dict"):
        Source("s3://bucket/train", storage_options=options)


def test_an_option_the_filesystem_does_not_take_is_named_at_once(s3_env: str):
    # a TypeError counted as transient: retried for seconds, then reported raw
    source = Source("s3://bucket/train", storage_options={"endpoint": "http://127.0.0.1:1"})
    with pytest.raises(ShardError, match=r"does not take these storage_options .*'endpoint'"):
        source.read_index()
    assert source.retried == 0


def test_retries_are_counted_by_the_loader_whose_reads_made_them(
    s3_shards: str, faulty_proxy, monkeypatch: pytest.MonkeyPatch, make: Callable[..., Loader]
):
    # Loaders of one process share an S3 filesystem: each counted all of its retries
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faulty = make(s3_shards, 5, num_workers=0, chunk_size=4096)
    assert sorted(_labels(faulty)) == list(range(48))
    assert faulty.stats()["retried"] > 0
    faulty.close()
    faulty_proxy.every = 10**9  # no more faults
    clean = make(s3_shards, 5, num_workers=0, chunk_size=4096)
    assert sorted(_labels(clean)) == list(range(48))
    assert clean.stats()["retried"] == 0


def test_a_dead_pid_of_another_pid_namespace_does_not_judge_its_partial_file(tmp_path: Path):
    # containers sharing a host name (--uts=host) and a cache_dir see each other's PIDs as dead
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    host = socket.gethostname()
    mine = tmp_path / f"abc-shard-00000.tar.tmp-{dead}@{_writer_host()}-x1"
    theirs = tmp_path / f"abc-shard-00001.tar.tmp-{dead}@{host}~4026531999-x2"
    for p in (mine, theirs):
        p.write_bytes(b"partial")
    remove_partial_files(tmp_path)
    assert not mine.exists() and theirs.exists()


def test_a_killed_readers_partial_cache_file_is_removed_by_the_next_run(
    s3_shards: str, tmp_path: Path
):
    # only a reader's close() removed its partial copy: every SIGKILL or OOM mid-shard left one
    cache = tmp_path / "cache"
    script = f"""
import time
from gpufeed.data.source import Source
source = Source({s3_shards!r}, cache_dir={str(cache)!r})
f = source.open(source.read_index().shards[0])
f.read(1000)
time.sleep(600)
"""
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert wait_until(lambda: list(cache.rglob("*.tmp-*")), timeout=120)
    finally:
        child.kill()
        child.wait(timeout=60)
    (killed,) = cache.rglob("*.tmp-*")
    source = Source(s3_shards, cache_dir=cache)
    entries = source.read_index().shards
    live = source.open(entries[1])  # a live reader's partial copy...
    live.read(1000)
    beside = Source(s3_shards, cache_dir=cache)  # ...is kept by another run's first read
    with beside.open(entries[2]) as f:
        Source.finish(f)
    partial = list(cache.rglob("*.tmp-*"))
    assert not killed.exists() and len(partial) == 1
    Source.finish(live)
    live.close()
    assert not list(cache.rglob("*.tmp-*"))
    assert len(list(cache.rglob("*.tar"))) == 2
