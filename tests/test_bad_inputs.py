"""The bad-input sweep: every command, run for real (a subprocess), on a table of bad inputs.

Each case must end with the right exit code, one clear `gpufeed: error:` line on stderr naming
the input, no traceback, and nothing written, changed or deleted (the work folders, the current
directory and $TMPDIR are compared before and after). With GPUFEED_SWEEP_LOG=FILE every case
appends one JSON line (command, case, exit code, clear, traceback) there:
`benchmarks/bad_input_sweep.py` runs this file that way and prints the totals README quotes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufeed.data.packing import pack
from gpufeed.data.shards import INDEX_NAME, LEGACY_INDEX_NAME, Index
from gpufeed.demo.synth import make_image_folder
from gpufeed.profiler.session import steps_store_path, system_store_path, write_meta
from gpufeed.profiler.store import Store

CLI = [sys.executable, "-m", "gpufeed.cli"]


@dataclass(frozen=True)
class Case:
    """One bad input: argv (with {placeholders} for the prepared inputs), the text stderr must
    name, the exit code, and the environment it runs in ("s3", "s3-no-credentials", "s3-refused")."""

    name: str
    argv: tuple[str, ...]
    says: str
    code: int = 2
    env: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    unprivileged: bool = False  # run as `nobody` where the tests run as root (who reads anything)


def _cases() -> list[Case]:
    c = Case
    return [
        # pack
        c("src missing", ("pack", "{in}/nope", "{in}/out"), "{in}/nope does not exist"),
        c("src a device", ("pack", "/dev/null", "{in}/out"), "/dev/null is neither a folder"),
        c("src a file of no images", ("pack", "{in}/plain.txt", "{in}/out"), "no images found"),
        c(
            "list file unreadable",
            ("pack", "{in}/unreadable.txt", "{work}/out"),
            "cannot read list file {in}/unreadable.txt: Permission denied",
            unprivileged=True,
        ),
        c("binary list file", ("pack", "{in}/list.bin", "{in}/out"), "list.bin is binary"),
        c("negative label", ("pack", "{in}/neg.txt", "{in}/out"), "neg.txt:2: label -1"),
        c("huge label", ("pack", "{in}/huge.txt", "{in}/out"), "huge.txt:1: label 100000000000"),
        c(
            "src folder unreadable",
            ("pack", "{in}/images-unreadable", "{work}/out"),
            "images-unreadable: Permission denied",
            unprivileged=True,
        ),
        c("dst is a file", ("pack", "{in}/images", "{in}/plain.txt"), "plain.txt: it is a file"),
        c("dst in /proc", ("pack", "{in}/images", "/proc/gpufeed-x"), "/proc/gpufeed-x"),
        c("nothing packable", ("pack", "{in}/junk", "{in}/out"), "nothing packed from"),
        c("no class folders", ("pack", "{in}/flat", "{in}/out"), "has no class sub-folders"),
        c("workers 0", ("pack", "{in}/images", "{in}/out", "--workers", "0"), "--workers"),
        c("workers -3", ("pack", "{in}/images", "{in}/out", "--workers", "-3"), "--workers"),
        c("workers text", ("pack", "{in}/images", "{in}/out", "--workers", "x"), "--workers"),
        c("shard size text", ("pack", "{in}/images", "{in}/o", "--shard-size", "big"), "'big'"),
        c("quality 0", ("pack", "{in}/images", "{in}/out", "--quality", "0"), "--quality"),
        c("resize 2", ("pack", "{in}/images", "{in}/out", "--resize", "2"), "--resize"),
        c("timeout 0", ("pack", "{in}/images", "{in}/out", "--timeout", "0"), "--timeout 0"),
        c("timeout text", ("index", "{in}/a.tar", "--timeout", "soon"), "--timeout"),
        c("s3 missing bucket", ("pack", "{in}/images", "s3://nobucket/x"), "nobucket", env="s3"),
        c(
            "s3 no credentials",
            ("pack", "{in}/images", "s3://bucket/x"),
            "no usable credentials",
            env="s3-no-credentials",
        ),
        c(
            "s3 refused endpoint",
            ("pack", "{in}/images", "s3://bucket/x"),
            "cannot connect",
            env="s3-refused",
        ),
        # show / report / trace / ls on damaged or missing runs
        c("show missing run", ("show", "{in}/nope"), "{in}/nope"),
        c("show a file", ("show", "{in}/plain.txt"), "plain.txt"),
        c("show empty folder", ("show", "{in}/empty"), "not a gpufeed run directory"),
        c("show meta list", ("show", "{in}/run-meta-list"), "holds a JSON list"),
        c("show meta hosts 5", ("show", "{in}/run-hosts-5"), "'hosts' is 5"),
        c("show meta not json", ("show", "{in}/run-not-json"), "is not valid JSON"),
        c("show text in steps", ("show", "{in}/run-text-steps"), "not a number"),
        c(
            "show unreadable run",
            ("show", "{in}/run-unreadable"),
            "run-unreadable': Permission denied",
            unprivileged=True,
        ),
        c("report meta list", ("report", "{in}/run-meta-list"), "holds a JSON list"),
        c("report text in steps", ("report", "{in}/run-text-steps"), "not a number"),
        c("report watch nan", ("report", "{in}/run", "--watch", "nan"), "--watch nan"),
        c("report watch inf", ("report", "{in}/run", "--watch", "inf"), "--watch inf"),
        c("report watch -1", ("report", "{in}/run", "--watch", "-1"), "--watch -1"),
        c("report out in /proc", ("report", "{in}/run", "-o", "/proc/x.html"), "/proc/x.html"),
        c("report bad --set", ("report", "{in}/run", "--set", "junk"), "junk"),
        c("trace missing run", ("trace", "{in}/nope"), "{in}/nope"),
        c("trace meta hosts 5", ("trace", "{in}/run-hosts-5"), "'hosts' is 5"),
        c("trace out in /proc", ("trace", "{in}/run", "-o", "/proc/x.json"), "/proc/x.json"),
        c("ls a file", ("ls", "{in}/plain.txt"), "plain.txt is a file"),
        # index: existing WebDataset shards
        c("index shard missing", ("index", "{in}/nope/x.tar"), "{in}/nope/x.tar not found"),
        c("index not a tar", ("index", "{in}/notar/x.tar"), "x.tar is not an uncompressed tar"),
        c("index tar of no images", ("index", "{in}/noimg/x.tar"), "has no image member"),
        c(
            "index unknown class",
            ("index", "{in}/zebra/x.tar", "--classes", "{in}/classes.txt"),
            "unknown class 'zebra'",
        ),
        c("index no label", ("index", "{in}/shards/x.tar", "--label-field", "k"), "no label"),
        c(
            "index classes missing",
            ("index", "{in}/shards/x.tar", "--classes", "{in}/nope.txt"),
            "cannot read classes file {in}/nope.txt",
        ),
        c(
            "index classes binary",
            ("index", "{in}/shards/x.tar", "--classes", "{in}/list.bin"),
            "list.bin is binary",
        ),
        c(
            "index classes bad JSON",
            ("index", "{in}/shards/x.tar", "--classes", "{in}/classes-bad.json"),
            "classes-bad.json is not valid JSON",
        ),
        c(
            "index classes twice",
            ("index", "{in}/shards/x.tar", "--classes", "{in}/classes-twice.txt"),
            "names the class 'cat' twice",
        ),
        c(
            "index brace pattern matching nothing",
            ("index", "{in}/shards/y-{000..003}.tar"),
            "{in}/shards/y-000.tar not found",
        ),
        c("index unbalanced braces", ("index", "{in}/shards/y-{0..3.tar"), "bad brace pattern"),
        c("index unknown scheme", ("index", "nosuch://b/x.tar"), "Protocol not known: nosuch"),
        # export
        c("export missing run", ("export", "{in}/nope", "--tensorboard", "{work}/tb"), "nope"),
        c(
            "export meta list",
            ("export", "{in}/run-meta-list", "--tensorboard", "{work}/tb"),
            "holds a JSON list",
        ),
        c("export nothing asked", ("export", "{in}/run"), "--tensorboard"),
        c("export into a file", ("export", "{in}/run", "--tensorboard", "{in}/plain.txt"), "plain"),
        c("export into /proc", ("export", "{in}/run", "--tensorboard", "/proc/tb"), "/proc/tb"),
        c(
            "export unwritable dir",
            ("export", "{in}/run", "--tensorboard", "{in}/tb"),
            "cannot write {in}/tb: Permission denied",
            unprivileged=True,
        ),
        # trace --merge with a torch.profiler (Kineto) trace
        c(
            "trace merge missing",
            ("trace", "{in}/run", "--merge", "{in}/nope.json", "-o", "{work}/t.json"),
            "nope.json: no such file",
        ),
        c(
            "trace merge not JSON",
            ("trace", "{in}/run", "--merge", "{in}/plain.txt", "-o", "{work}/t.json"),
            "plain.txt is not a JSON trace",
        ),
        c(
            "trace merge no events",
            ("trace", "{in}/run", "--merge", "{in}/kineto-list.json", "-o", "{work}/t.json"),
            "has no traceEvents list",
        ),
        c(
            "trace merge unreadable",
            ("trace", "{in}/run", "--merge", "{in}/unreadable.txt", "-o", "{work}/t.json"),
            "Permission denied",
            unprivileged=True,
        ),
        # several runs (one per host) with one missing or damaged
        c("show two, one missing", ("show", "{in}/run", "{in}/nope"), "{in}/nope"),
        c("show glob of nothing", ("show", "{in}/nope-*"), "matches no directory"),
        c("show one host twice", ("show", "{in}/run", "{in}/run-again"), "h1"),
        c("report two, one damaged", ("report", "{in}/run", "{in}/run-meta-list"), "JSON list"),
        c("trace two, one missing", ("trace", "{in}/run", "{in}/nope"), "{in}/nope"),
        c(
            "export two, one missing",
            ("export", "{in}/run", "{in}/nope", "--tensorboard", "{work}/tb"),
            "{in}/nope",
        ),
        # diagnose / tune / bench / profile options
        c("diagnose seconds -1", ("diagnose", "--data", "{in}/images", "--seconds", "-1"), "-1"),
        c("diagnose seconds nan", ("diagnose", "--data", "{in}/images", "--seconds", "nan"), "nan"),
        c("diagnose workers -3", ("diagnose", "--data", "{in}/images", "--workers", "-3"), "-3"),
        c("diagnose batch 0", ("diagnose", "--data", "{in}/images", "--batch-size", "0"), "0"),
        c("diagnose data missing", ("diagnose", "--data", "{in}/nope", "--seconds", "1"), "nope"),
        c("diagnose NUL shard", ("diagnose", "--data", "{in}/nul-shards"), "NUL"),
        c("tune seconds 0", ("tune", "--data", "{in}/images", "--seconds", "0"), "--seconds 0"),
        c("tune data missing", ("tune", "--data", "{in}/nope", "--seconds", "1"), "nope"),
        *(
            c(f"{cmd} image size too big", (cmd, "--data", "{in}/images", *big), " ".join(big))
            for cmd in ("diagnose", "tune")
            for big in [("--image-size", "100000")]
        ),
        c("bench unknown", ("bench", "nosuch", "-o", "{in}/b"), "nosuch"),
        c("bench workers -3", ("bench", "workers", "--workers", "-3", "-o", "{in}/b"), "-3"),
        c("bench budget -1", ("bench", "workers", "--budget", "-1", "-o", "{in}/b"), "-1"),
        c("profile no command", ("profile", "--out", "{in}/runs"), "command"),
        c("profile interval 0", ("profile", "-i", "0", "-o", "{in}/r", "--", "true"), "interval"),
        c("profile interval nan", ("profile", "-i", "nan", "-o", "{in}/r", "--", "true"), "nan"),
        c("profile unknown option", ("profile", "--bogus", "--", "true"), "no such option --bogus"),
        c(
            "profile script not executable",
            ("profile", "-o", "{work}/r", "--", "{in}/train_small.py"),
            "train_small.py is not executable: run it with Python, `gpufeed profile -- python",
            code=126,
        ),
        c(
            "profile name not UTF-8",
            ("profile", "--name", "n\udce9", "-o", "{work}/r", "--", "true"),
            "--name n\\xe9: not valid UTF-8",
        ),
        # outputs checked before any work and before any other output is written
        c(
            "report json under a file",
            ("report", "{in}/run", "--json", "{in}/plain.txt/f.json", "-o", "{work}/ok1.html"),
            "--json {in}/plain.txt/f.json: {in}/plain.txt is a file, not a folder",
        ),
        c("report out a folder", ("report", "{in}/run", "-o", "{in}/empty"), "is a folder"),
        c(
            "report config not UTF-8",
            ("report", "{in}/run", "--config", "{in}/b6.toml"),
            "config file {in}/b6.toml is not UTF-8 text",
        ),
        c("show bad --set", ("show", "{in}/run", "--set", "junk"), "junk"),
        c(
            "show config not UTF-8",
            ("show", "{in}/run", "--config", "{in}/b6.toml"),
            "b6.toml is not UTF-8",
        ),
        c(
            "show config misspelt table",
            ("show", "{in}/run", "--config", "{in}/rulez.toml"),
            "{in}/rulez.toml: [rulez] is not read",
        ),
        c(
            "trace out under a file",
            ("trace", "{in}/run", "-o", "{in}/plain.txt/t.json"),
            "{in}/plain.txt is a file, not a folder",
        ),
        c("trace max-mb 0", ("trace", "{in}/run", "--max-mb", "0"), "--max-mb 0: give a size"),
        c("trace max-mb -1", ("trace", "{in}/run", "--max-mb", "-1"), "--max-mb -1: give a size"),
        c("trace start nan", ("trace", "{in}/run", "--start", "nan"), "--start nan: give seconds"),
        c("trace start -5", ("trace", "{in}/run", "--start", "-5"), "--start -5: give seconds"),
        c("trace end inf", ("trace", "{in}/run", "--end", "inf"), "--end inf: give seconds"),
        c(
            "trace end before start",
            ("trace", "{in}/run", "--start", "3", "--end", "2"),
            "must be after",
        ),
        c(
            "trace start past the end",
            ("trace", "{in}/run", "--start", "100000"),
            "past the run's end",
        ),
        c(
            "trace merge ts text",
            ("trace", "{in}/run", "--merge", "{in}/kineto-ts-text.json", "-o", "{work}/t.json"),
            "kineto-ts-text.json: traceEvents[1] ('aten::mm') has 'ts': 'abc'",
        ),
        c(
            "trace merge ts 1e300",
            ("trace", "{in}/run", "--merge", "{in}/kineto-ts-huge.json", "-o", "{work}/t.json"),
            "kineto-ts-huge.json: traceEvents[0] ('aten::mm') has 'ts': 1e+300",
        ),
        c(
            "export tensorboard not UTF-8",
            ("export", "{in}/run", "--tensorboard", "{work}/r\udcffuns"),
            "r\\xffuns: not valid UTF-8",
        ),
        c(
            "diagnose json a folder",
            ("diagnose", "--data", "{in}/images", "--json", "{in}/empty"),
            "--json {in}/empty is a folder: give a file name",
        ),
        c(
            "diagnose json under a file",
            ("diagnose", "--data", "{in}/images", "--json", "{in}/plain.txt/x.json"),
            "{in}/plain.txt is a file, not a folder",
        ),
        c(
            "tune out a folder",
            ("tune", "--data", "{in}/images", "-o", "{in}/empty"),
            "--out {in}/empty is a folder",
        ),
        c(
            "tune out under a file",
            ("tune", "--data", "{in}/images", "-o", "{in}/plain.txt/w.json"),
            "{in}/plain.txt is a file, not a folder",
        ),
        c("bench out a file", ("bench", "workers", "-o", "{in}/plain.txt"), "plain.txt is a file"),
        c("demo out a file", ("demo", "--tiny", "-o", "{in}/plain.txt"), "plain.txt is a file"),
    ]


CASES = _cases()
UNREADABLE = ("run-unreadable", "images-unreadable", "unreadable.txt")


def _make_run(run_dir: Path, meta: object = None, steps: list[tuple] | None = None) -> Path:
    """A run directory written through the real store; `meta` replaces meta.json's content."""
    run_dir.mkdir()
    write_meta(
        run_dir,
        {"name": "t", "command": ["python", "t.py"], "start_time": 1000.0, "end_time": 1100.0},
    )
    store = Store(system_store_path(run_dir, "h1"))
    store.write({"host": "h1", "interval": 0.2, "gpus": []}, system=[(1001.0, "cpu.util", "", 5.0)])
    store.close()
    store = Store(steps_store_path(run_dir, "h1", 100))
    info = {"host": "h1", "rank": 0, "local_rank": 0, "world_size": 1, "pid": 100}
    store.write(info, steps=steps or [(0, 1010.0, 1011.0, 0.1, 8.0, None)])
    store.close()
    if meta is not None:
        (run_dir / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return run_dir


def _tar(path: Path, members: dict[str, bytes]) -> None:
    """A WebDataset-style tar shard holding `members` (name -> bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _prepare(root: Path) -> None:
    """Every input the table names, under `root`."""
    images = make_image_folder(root / "images", 8, 2, short_side=(32, 40), quality=(85, 90))
    first = sorted(images.glob("*/*.jpg"))
    (root / "plain.txt").write_text("hello\n")
    (root / "list.bin").write_bytes(b"\x00\x01\x02 0\n")
    (root / "neg.txt").write_text(f"{first[0]} 0\n{first[1]} -1\n")
    (root / "huge.txt").write_text(f"{first[0]} 100000000000\n")
    (root / "junk" / "a").mkdir(parents=True)
    (root / "junk" / "a" / "x.jpg").write_text("not an image")
    (root / "flat").mkdir()
    (root / "flat" / "x.jpg").write_bytes(first[0].read_bytes())
    (root / "empty").mkdir()
    _tar(root / "shards" / "x.tar", {"s1.jpg": first[0].read_bytes(), "s1.json": b'{"cls": 0}'})
    _tar(
        root / "zebra" / "x.tar", {"s1.jpg": first[0].read_bytes(), "s1.json": b'{"cls": "zebra"}'}
    )
    _tar(root / "noimg" / "x.tar", {"s1.txt": b"hello", "s1.json": b'{"cls": 0}'})
    (root / "notar").mkdir()
    (root / "notar" / "x.tar").write_text("hello\n")
    (root / "classes.txt").write_text("cat\ndog\n")
    (root / "classes-twice.txt").write_text("cat\ndog\ncat\n")
    (root / "classes-bad.json").write_text("{not json")
    (root / "kineto-list.json").write_text("[1, 2]")
    base = {"baseTimeNanoseconds": 1_700_000_000 * 10**9}
    for name, ts in (("kineto-ts-text.json", "abc"), ("kineto-ts-huge.json", 1e300)):
        events = [{"ph": "X", "name": "aten::mm", "ts": ts, "dur": 3}]
        if name == "kineto-ts-text.json":
            events.insert(0, {"ph": "X", "name": "aten::mm", "ts": 5, "dur": 3})
        (root / name).write_text(json.dumps({**base, "traceEvents": events}))
    (root / "b6.toml").write_bytes(b"\xff\xfe[rules.StepOutlier]\n")
    (root / "rulez.toml").write_text("[rulez.StepOutlier]\nenabled = false\n")
    (root / "train_small.py").write_text("print('trained')\n")  # not executable (0o644 below)
    _make_run(root / "run")
    _make_run(root / "run-again")  # the same host and rank as "run"
    _make_run(root / "run-meta-list", meta=[1, 2])
    _make_run(root / "run-hosts-5", meta={"hosts": 5})
    _make_run(root / "run-not-json", meta="{not json")
    _make_run(root / "run-text-steps", steps=[(0, "yesterday", 1011.0, 0.1, 8.0, None)])
    _make_run(root / "run-unreadable")
    shutil.copytree(images, root / "images-unreadable")
    nul = root / "nul-shards"
    pack(images, nul, workers=1, progress=False)
    written = nul / INDEX_NAME
    index = json.loads(Index.from_bytes(written.read_bytes(), "test").to_bytes(version=1))
    index["shards"][0]["name"] = "shard\x00.tar"
    (nul / LEGACY_INDEX_NAME).write_text(json.dumps(index))  # the legacy name is still read
    written.unlink()
    for top, _, files in os.walk(root):  # everyone may read (see `unprivileged`)
        os.chmod(top, 0o755)
        for name in files:
            os.chmod(os.path.join(top, name), 0o644)
    (root / "unreadable.txt").write_text(f"{first[0]} 0\n")
    for name in UNREADABLE:
        (root / name).chmod(0)


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file, and every folder, under `roots` (a folder's own mtime is
    left out: reading a store makes and deletes SQLite's scratch files next to it)."""
    seen: dict[str, tuple[int, int]] = {}
    for root in roots:
        for top, dirs, files in os.walk(root):
            seen.update({os.path.join(top, d): (0, 0) for d in dirs})
            for name in files:
                st = os.lstat(os.path.join(top, name))
                seen[os.path.join(top, name)] = (st.st_size, st.st_mtime_ns)
    return seen


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 holding one empty bucket, `bucket`."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    import boto3

    boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="t",
        aws_secret_access_key="t",
        region_name="us-east-1",
    ).create_bucket(Bucket="bucket")
    yield url
    server.stop()


def _env(case: Case, tmp: Path, s3: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(TMPDIR=str(tmp), AWS_EC2_METADATA_DISABLED="true", COLUMNS="200")
    env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    if case.env.startswith("s3"):
        assert s3 is not None
        env.update(AWS_ENDPOINT_URL=s3, AWS_DEFAULT_REGION="us-east-1")
        if case.env != "s3-no-credentials":
            env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        if case.env == "s3-refused":
            with socket.create_server(("127.0.0.1", 0)) as s:
                env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{s.getsockname()[1]}"
    return {**env, **case.extra}


def _world_folder() -> Path:
    """A new folder outside pytest's private one, that `nobody` may use too."""
    path = Path(tempfile.mkdtemp(prefix="gpufeed-sweep-"))
    path.chmod(0o777)
    return path


def _remove(path: Path) -> None:
    for top, _, _ in os.walk(path):
        os.chmod(top, 0o755)
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def inputs() -> Iterator[Path]:
    """The prepared bad inputs (shared by every case: each checks that it changed nothing)."""
    root = _world_folder()
    _prepare(root)
    root.chmod(0o755)
    yield root
    for name in UNREADABLE:
        (root / name).chmod(0o755)
    _remove(root)


@pytest.fixture
def work() -> Iterator[Path]:
    """The case's current directory, $TMPDIR and output folder."""
    path = _world_folder()
    yield path
    _remove(path)


def _unprivileged() -> list[str]:
    """Command prefix that drops root's right to read everything (nothing if not root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot test unreadable paths")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line_and_writes_nothing(
    case: Case, inputs: Path, work: Path, request: pytest.FixtureRequest
):
    cwd, tmp = work / "cwd", work / "tmp"
    for d in (cwd, tmp):
        d.mkdir()
        d.chmod(0o777)
    s3 = request.getfixturevalue("s3_endpoint") if case.env else None
    argv = [a.replace("{in}", str(inputs)).replace("{work}", str(work)) for a in case.argv]
    says = case.says.replace("{in}", str(inputs))
    prefix = _unprivileged() if case.unprivileged else []
    before = _snapshot(inputs, work)
    done = subprocess.run(
        [*prefix, *CLI, *argv],
        cwd=cwd,
        env=_env(case, tmp, s3),
        capture_output=True,
        text=True,
        timeout=120,
    )
    after = _snapshot(inputs, work)
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpufeed: error:")]
    usage = "Usage:" in done.stderr  # typer's own refusal of a malformed option value
    traceback = "Traceback" in done.stderr or "Traceback" in done.stdout
    clear = (
        done.returncode == case.code
        and not traceback
        and says in done.stderr
        and (len(errors) == 1 or (usage and not errors))
        and after == before
    )
    if os.environ.get("GPUFEED_SWEEP_LOG"):
        with open(os.environ["GPUFEED_SWEEP_LOG"], "a") as log:
            row = {"command": argv[0], "case": case.name, "code": done.returncode}
            log.write(json.dumps({**row, "clear": clear, "traceback": traceback}) + "\n")
    assert not traceback, done.stderr
    assert done.returncode == case.code, done.stderr
    assert says in done.stderr, done.stderr
    assert len(errors) == 1 or (usage and not errors), done.stderr
    assert sorted(set(after) ^ set(before)) == [], "written or deleted"
    assert after == before, "changed"
