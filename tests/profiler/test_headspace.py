"""`gpufeed profile --headspace N`: after warm-up N steps are fed one kept batch, kept apart from the
training steps, and the job's share of its own ceiling is measured, shown and used by the advice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpufeed
from gpufeed.analysis.rules.context import Context
from gpufeed.commands.report import write_report
from gpufeed.profiler.headspace import NOTHING, Headspace, training_iterator

TRAINERS = Path(__file__).resolve().parent / "trainers"
SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _profile(gpufeed_cli, tmp_path: Path, *command: str, headspace: int = 20):
    cp = subprocess.run(
        [*gpufeed_cli("profile", "--out", str(tmp_path / "runs"), "--interval", "0.1",
                      "--headspace", str(headspace), "--"), *command],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return gpufeed.load(run_dir)


@pytest.fixture(scope="module")
def loader_bound(tmp_path_factory, gpufeed_cli_module) -> tuple[gpufeed.analysis.run.Run, float]:
    """The loader-bound loop profiled with --headspace 20, and its own synthetic / real step time
    (the same loop on one batch, unprofiled, over the same loop on its DataLoader)."""
    tmp = tmp_path_factory.mktemp("headspace")
    script = str(TRAINERS / "loader_bound.py")
    run = _profile(gpufeed_cli_module, tmp, sys.executable, script, "real", str(tmp / "real.json"))
    subprocess.run([sys.executable, script, "synthetic", str(tmp / "syn.json")], check=True)
    real, synthetic = (json.loads((tmp / f).read_text()) for f in ("real.json", "syn.json"))
    return run, synthetic["median_step"] / real["median_step"]


@pytest.fixture(scope="module")
def gpufeed_cli_module():
    return lambda *args: [sys.executable, "-m", "gpufeed.cli", *args]


def test_replayed_steps_are_kept_apart_from_the_training_steps(loader_bound) -> None:
    run, _ = loader_bound
    # 6 epochs of 20 batches, and 20 steps fed one kept batch after the 10 warm-up steps
    assert len(run.steps) == 120 and len(run.headspace) == 20
    assert run.headspace["step"].tolist() == list(range(11, 31))
    assert run.meta["headspace"] == 20 and run.meta["ranks"][0]["headspace"] == [11, 30]
    assert not set(run.steps["step"]) & set(run.headspace["step"])
    assert (run.headspace["samples"] == 16).all()
    # a replayed step asks the loader for nothing (a real one waits 24 ms of sleeping reads)
    assert (run.headspace["data_wait"] < 0.005).all()


def test_the_share_of_its_own_ceiling_matches_synthetic_over_real(loader_bound) -> None:
    run, measured = loader_bound
    ceiling = Context(run).ceiling
    assert ceiling is not None and ceiling.replayed_steps == 20
    assert ceiling.share == pytest.approx(measured, abs=0.05)


def test_the_loader_advice_is_bounded_by_the_speedup_the_ceiling_leaves(loader_bound) -> None:
    run, _ = loader_bound
    (f,) = [f for f in gpufeed.analyze(run) if f.rule == "DataLoaderBottleneck"]
    ceiling = Context(run).ceiling
    assert f.evidence["ceiling_share"] == pytest.approx(ceiling.share, abs=1e-4)
    assert f.evidence["max_speedup"] == pytest.approx(ceiling.speedup, abs=1e-3)
    # the recommended workers (asleep on reads: as many as needed) are predicted to reach it but
    # for taking each batch from a worker
    n = f.evidence["recommended_num_workers"]
    assert f.evidence["est_speedup_basis"].startswith(f"num_workers={n}:")
    assert 0.8 * ceiling.speedup < f.est_speedup <= ceiling.speedup
    assert "of its own ceiling" in f.recommendation


def test_show_and_the_report_state_the_share_of_the_ceiling(loader_bound, tmp_path) -> None:
    from rich.console import Console

    from gpufeed.commands.show import show

    run, _ = loader_bound
    console = Console(record=True, width=200)
    show(str(run.path), console=console)
    text = console.export_text()
    share = f"{100 * Context(run).ceiling.share:.0f}%"
    assert f"Own ceiling: the steps run at {share} of this job's speed without input" in text
    write_report(str(run.path), out=tmp_path / "r.html", echo=lambda _: None)
    page = (tmp_path / "r.html").read_text()
    assert "Own ceiling" in page and "fed one kept batch" in page


def test_validation_passes_in_the_window_read_their_own_data(gpufeed_cli_module, tmp_path) -> None:
    # eval_loop.py: 4 epochs of 13 steps, a 4-batch validation pass after each; steps 11..30 are
    # replayed, so two validation passes fall inside the window
    run = _profile(gpufeed_cli_module, tmp_path, sys.executable, str(SCENARIOS / "eval_loop.py"),
                   "plain")  # fmt: skip
    assert len(run.headspace) == 20 and len(run.steps) == 52
    assert len(run.evals) == 4
    assert (run.evals["batches"] == 4).all() and (run.evals["samples"] == 128).all()


def test_a_run_that_ends_before_warm_up_is_over_says_the_ceiling_was_not_measured(
    gpufeed_cli_module, tmp_path
) -> None:
    from rich.console import Console

    from gpufeed.commands.show import show

    script = tmp_path / "short.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "m = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for x in DataLoader(torch.randn(32, 4), batch_size=8):\n"
        "    m(x).sum().backward()\n    opt.step()\n"
    )
    run = _profile(gpufeed_cli_module, tmp_path, sys.executable, str(script))
    assert len(run.steps) == 4 and len(run.headspace) == 0 and Context(run).ceiling is None
    console = Console(record=True, width=200)
    show(str(run.path), console=console)
    assert "Own ceiling: not measured: --headspace 20 found no training batch" in (
        console.export_text()
    )


@pytest.mark.parametrize("value", ["-1", "abc", "100001"])
def test_a_bad_headspace_is_one_line_naming_the_option(gpufeed_cli_module, tmp_path, value):
    cp = subprocess.run(
        gpufeed_cli_module("profile", "--headspace", value, "--", sys.executable, "-c", "0"),
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert cp.returncode == 2 and "--headspace" in cp.stderr and "Traceback" not in cp.stderr
    assert not (tmp_path / "gpufeed-runs").exists()


# --- the replay itself -----------------------------------------------------------------------


def test_the_window_starts_after_warm_up_at_the_training_iterators_batch() -> None:
    hs = Headspace(3, after=10)
    hs.offer(10, serial=1, batch="b10")  # which iterator trains is not known yet
    assert hs.window is None
    hs.train_serial = 1
    hs.offer(9, 1, "b9")  # still warming up
    hs.offer(10, 2, "eval batch")  # another iterator: a validation loader
    assert hs.window is None
    hs.offer(10, 1, "b10")
    assert hs.window == (11, 13)
    assert hs.replay(10, 1) is NOTHING  # the step it was kept in reads its own data
    assert [hs.replay(s, 1) for s in (11, 12, 13)] == ["b10"] * 3
    assert hs.replay(12, 2) is NOTHING  # a validation pass in the window reads its own data
    assert hs.replay(14, 1) is NOTHING and hs._batch is NOTHING  # past it: the batch let go
    hs.offer(20, 1, "b20")  # once only
    assert hs.window == (11, 13)


def test_the_training_iterator_is_the_one_a_training_forward_took_its_batch_from() -> None:
    model = frozenset({7})
    events = [
        ("f", 0, 1, 8, 5, False),  # a validation batch ...
        ("F", 1, 2, 8, 7, False, False),  # ... under no_grad
        ("f", 2, 3, None, 6, True),  # that loader's end
        ("f", 3, 4, 16, 4, False),  # the training batch
        ("F", 4, 5, 16, 7, True, True),
        ("B", 5, 6),
    ]
    assert training_iterator(events, model) == 4
    assert training_iterator(events[:2], model) == 5  # no training forward: the last batch
    assert training_iterator([("O", 0, 1)], model) is None


def test_a_gpufeed_loader_is_replayed_too(gpufeed_cli_module, tmp_path) -> None:
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    pack(make_image_folder(tmp_path / "img", 24, 2), tmp_path / "pack", workers=1, progress=False)
    script = tmp_path / "loader.py"
    script.write_text(
        "import sys, torch\nfrom gpufeed.data import Augment, Loader\n"
        "loader = Loader(sys.argv[1], 4, num_workers=2, augment=Augment(size=(8, 8)), "
        "device='cpu')\n"
        "model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(4):\n    loader.set_epoch(epoch)\n    for x, y in loader:\n"
        "        torch.nn.functional.cross_entropy(model(x), y).backward()\n"
        "        opt.step()\n        opt.zero_grad()\n"
    )
    run = _profile(
        gpufeed_cli_module, tmp_path, sys.executable, str(script), str(tmp_path / "pack"),
        headspace=5,
    )  # fmt: skip
    # 4 epochs of 6 batches, and 5 steps fed one kept batch after the 10 warm-up steps
    assert len(run.steps) == 24 and run.headspace["step"].tolist() == [11, 12, 13, 14, 15]
    assert (run.headspace["samples"] == 4).all() and (run.steps["samples"] == 4).all()
