"""Optional extras: the core installs and works without them, and a feature used without its extra
says which one to install. Missing packages are simulated in a fresh interpreter by a meta-path
finder that refuses to import them (nothing is uninstalled)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BLOCKER = """
import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
BLOCKED = set(sys.argv[1].split(","))
sys.meta_path.insert(0, _Blocked())
"""


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    images = make_image_folder(tmp_path / "images", 8, 2, short_side=(40, 48))
    pack(images, tmp_path / "shards", workers=1, progress=False)
    return tmp_path / "shards"


def _run(blocked: str, code: str, *args: str) -> subprocess.CompletedProcess:
    script = BLOCKER + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script, blocked, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_core_loads_local_shards_without_any_extra(shards: Path):
    res = _run(
        "s3fs,botocore,aiobotocore,aiohttp,matplotlib,torchvision,nvidia",
        """
        import gpufeed, gpufeed.cli
        from gpufeed.data import Loader
        from gpufeed.data.augment import Augment
        with Loader(sys.argv[2], 4, num_workers=0, device="cpu",
                    augment=Augment(size=(16, 16))) as loader:
            images, labels = next(iter(loader))
        print("batch", tuple(images.shape))
        """,
        str(shards),
    )
    assert res.returncode == 0, res.stderr
    assert "batch (4, 3, 16, 16)" in res.stdout


def test_s3_without_the_s3_extra_is_one_clear_line():
    res = _run(
        "s3fs",
        """
        from gpufeed.cli import main
        sys.argv = ["gpufeed", "index", "s3://bucket/wds-{0..1}.tar"]
        main()
        """,
    )
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert "needs s3fs, which is not installed" in res.stderr
    assert "pip install 'gpufeed[s3]'" in res.stderr


def test_a_loader_on_s3_without_the_s3_extra_names_it():
    res = _run(
        "s3fs",
        """
        from gpufeed.data import Loader
        from gpufeed.extras import MissingExtra
        try:
            Loader("s3://bucket/train", 4, num_workers=0)
        except MissingExtra as e:
            print("error:", e)
        """,
    )
    assert "error: reading and writing s3:// data sets needs s3fs" in res.stdout, res.stderr
    assert "gpufeed[s3]" in res.stdout


def test_bench_charts_without_the_bench_extra_warn_and_keep_the_results(tmp_path: Path):
    res = _run(
        "matplotlib",
        """
        import warnings
        from pathlib import Path
        from gpufeed.bench.plots import bars
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = bars(Path(sys.argv[2]) / "r.png", "t", ["a"], {"images/s": [1.0]})
        print("returned", out)
        print("warning:", caught[0].message)
        """,
        str(tmp_path),
    )
    assert "returned None" in res.stdout, res.stderr
    assert "pip install 'gpufeed[bench]'" in res.stdout
    assert not (tmp_path / "r.png").exists()


@pytest.mark.parametrize(
    ("extra", "module"),
    [
        ("gpu", "torchvision"),
        ("dali", "nvidia"),
        ("nvimgcodec", "nvidia"),
        ("bench", "matplotlib"),
        ("ray", "ray"),
        ("tensorboard", "tensorboard"),
        ("huggingface", "transformers"),
        ("lightning", "pytorch_lightning"),
    ],
)
def test_require_names_the_extra_to_install(extra: str, module: str):
    res = _run(
        module,
        f"""
        from gpufeed.extras import MissingExtra, require
        try:
            require({extra!r})
        except MissingExtra as e:
            print("error:", e)
        """,
    )
    assert f"pip install 'gpufeed[{extra}]'" in res.stdout, res.stderr


def test_whether_an_extra_is_installed_is_a_yes_or_no_not_an_error():
    res = _run(
        "nvidia",
        """
        from gpufeed.extras import installed
        print(installed("nvimgcodec"), installed("s3"))
        """,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("user_setting", [None, "2"])
def test_nvimgcodec_imports_quiet_unless_the_user_asks_for_its_log(user_setting: str | None):
    pytest.importorskip("nvidia.nvimgcodec")
    code = """
        import io, os
        from PIL import Image
        from gpufeed.extras import require
        nic = require("nvimgcodec")
        print("after import:", os.environ.get("PYNVIMGCODEC_VERBOSITY"))
        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (10, 200, 30)).save(buf, format="JPEG")
        decoder = nic.Decoder(
            device_id=nic.NVIMGCODEC_DEVICE_CPU_ONLY,
            backends=[nic.Backend(nic.BackendKind.CPU_ONLY)],
        )
        print("decoded:", [im is not None for im in decoder.decode([buf.getvalue()[:200]])])
        """
    env = {k: v for k, v in os.environ.items() if k != "PYNVIMGCODEC_VERBOSITY"}
    if user_setting is not None:
        env["PYNVIMGCODEC_VERBOSITY"] = user_setting
    res = subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code), "nothing"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "decoded: [False]" in res.stdout, res.stderr
    # the environment is as it was: gpufeed's default held only while the library was imported
    assert f"after import: {user_setting}" in res.stdout
    assert ("Invalid marker" in res.stderr) == (user_setting is not None), res.stderr
