"""The command line prints what a command returns, on stdout (progress on stderr), and turns bad
input into one `gpufeed: error:` line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typer.testing import CliRunner

from gpufeed.cli import app

THIS = __file__  # the user objects below are named as THIS:function, like a user's train.py
runner = CliRunner()


def tensors() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(64, 3, 32, 32), torch.zeros(64)), batch_size=16)


def tiny_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.Flatten(), nn.LazyLinear(2))


def test_diagnose_prints_the_diagnosis_it_returns_with_the_offload_advice():
    data, model = f"{THIS}:tensors", f"{THIS}:tiny_cnn"
    args = ["diagnose", "--data", data, "--model", model, "--device", "cpu", "--seconds", "0.5"]
    res = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "gpufeed diagnose:" in res.stdout and "BOUND" in res.stdout
    assert "offload to CPU nodes:" in res.stdout
    assert "measuring the loader alone" in res.stderr  # progress, not the result
    assert "measuring" not in res.stdout


def test_ls_of_a_folder_that_does_not_exist_says_so_and_exits_2(tmp_path):
    res = runner.invoke(app, ["ls", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert f"{tmp_path / 'nope'}: no such folder" in res.stderr and res.stdout == ""


def test_ls_without_runs_yet_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./gpufeed-runs here: nothing profiled yet, not an error
    res = runner.invoke(app, ["ls"])
    assert res.exit_code == 0 and "No runs under gpufeed-runs/" in res.stdout


def test_trace_help_says_what_trace_does_now():
    res = runner.invoke(app, ["trace", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.stdout.split())
    assert "several RUNs, one per host, are read as one" in text
    assert "forward, backward and optimizer" in text and "evaluation passes" in text
    assert "--merge" in text and "RUN/trace-merged.json" in text


def test_diagnose_json_writes_the_diagnosis_for_scripts(tmp_path):
    out = tmp_path / "diagnosis.json"
    data, model = f"{THIS}:tensors", f"{THIS}:tiny_cnn"
    args = ["diagnose", "--data", data, "--model", model, "--device", "cpu", "--seconds", "0.5"]
    res = runner.invoke(app, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert (
        doc["verdict"] in ("input-bound", "compute-bound") and doc["verdict"].upper() in res.stdout
    )
    assert doc["model_images_per_s"] > 0 and doc["batch_shape"] == [16, 3, 32, 32]
    assert doc["offload"]["text"].startswith("offload to CPU nodes:")


def test_diagnose_json_into_a_missing_folder_is_refused_before_measuring(tmp_path):
    target = tmp_path / "nope" / "d.json"
    res = runner.invoke(app, ["diagnose", "--data", f"{THIS}:tensors", "--json", str(target)])
    assert res.exit_code == 2
    assert f"--json {target}: folder {tmp_path / 'nope'} does not exist" in res.stderr
    assert "measuring" not in res.output


def test_diagnose_json_that_is_a_folder_or_under_a_file_is_refused_before_measuring(tmp_path):
    script = tmp_path / "train_small.py"
    script.write_text("")
    for target, says in (
        (tmp_path, f"--json {tmp_path} is a folder: give a file name"),
        (script / "x.json", f"--json {script / 'x.json'}: {script} is a file, not a folder"),
    ):
        res = runner.invoke(app, ["diagnose", "--data", f"{THIS}:tensors", "--json", str(target)])
        assert res.exit_code == 2 and says in res.stderr, res.output
        assert "measuring" not in res.output


def test_profile_refuses_an_option_it_does_not_know_instead_of_running_it(tmp_path):
    res = runner.invoke(app, ["profile", "-o", str(tmp_path / "r"), "--bogus", "--", "true"])
    assert res.exit_code == 2 and "no such option --bogus" in res.stderr, res.output
    assert not (tmp_path / "r").exists()


def test_python_dash_m_gpufeed_is_the_command_line(tmp_path):
    cp = subprocess.run(
        [sys.executable, "-m", "gpufeed", "ls", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 2 and "gpufeed: error:" in cp.stderr and "nope" in cp.stderr
