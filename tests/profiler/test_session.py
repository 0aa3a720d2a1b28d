"""Run directory naming, identity under torchrun, and input validation."""

from __future__ import annotations

import re

import pytest

from gpufeed.profiler.session import (
    ProfileError,
    check_interval,
    create_run_dir,
    identity,
    run_name,
)


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "train.py", "--lr", "1"], "train"),
        (["torchrun", "--nproc_per_node", "2", "dir/ddp_train.py"], "ddp_train"),
        (["python", "-m", "pkg.trainer"], "trainer"),
        (["./run.sh"], "run.sh"),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "ddp.py"], "ddp"),
        # a shell string names the run by its script alone, never by what it sets (a secret)
        (["bash", "-c", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwx python train.py --lr 1"], "train"),
        (["bash", "-c", "WANDB_API_KEY=s3cr3t make train"], "bash"),
        (["bash", "-lc", "hf login --token hf_AbCd0123456789 && python train.py"], "train"),
        (["sh", "-ec", "login --token s3cretTOKEN123 && ./go"], "sh"),
    ],
)
def test_run_name_is_the_script_stem(command, name):
    assert run_name(command) == name


def test_a_script_whose_path_has_a_space_names_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my script.py").write_text("")
    assert run_name(["python", "my script.py"]) == "my_script"  # one argv word, a real file


def test_run_dir_is_name_timestamp_id(tmp_path):
    a = create_run_dir(tmp_path / "out", "my run")
    b = create_run_dir(tmp_path / "out", "my run")
    assert re.fullmatch(r"my_run-\d{8}-\d{6}-[0-9a-f]{6}", a.name)
    assert a != b and a.is_dir() and b.is_dir()


def test_a_long_name_is_cut_to_fit_a_file_name_and_long_names_stay_apart(tmp_path):
    # 300 characters used to fail the mkdir, and the command ran unprofiled
    a = create_run_dir(tmp_path, "x" * 300 + "a")
    b = create_run_dir(tmp_path, "x" * 300 + "b")
    assert a.is_dir() and b.is_dir() and len(a.name) <= 130
    assert a.name.split("-")[1] != b.name.split("-")[1]  # the hashes of the whole names differ


def test_unusable_out_dir_names_itself(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ProfileError, match="--out") as e:
        create_run_dir(tmp_path / "f" / "out", "x")
    assert str(tmp_path / "f") in str(e.value)


@pytest.mark.parametrize("value", [0.05, 0.2, 60])
def test_accepted_intervals(value):
    assert check_interval(value) == value


@pytest.mark.parametrize("value", [0.049, 60.5, "abc"])
def test_rejected_intervals(value):
    with pytest.raises(ProfileError, match="--interval"):
        check_interval(value)


def test_identity_reads_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    who = identity()
    assert (who["rank"], who["local_rank"], who["world_size"]) == (5, 1, 8)


def test_identity_of_a_single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    who = identity()
    assert (who["rank"], who["local_rank"], who["world_size"]) == (0, 0, 1)


def test_identity_takes_empty_or_odd_rank_variables_without_failing(monkeypatch, capsys):
    # `export LOCAL_RANK=$SLURM_LOCALID` outside srun exports an empty variable: int('') raised
    # inside the recorder's start-up, and no step of the run was recorded
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "")
    monkeypatch.setenv("WORLD_SIZE", " 4 ")
    who = identity()
    assert (who["rank"], who["local_rank"], who["world_size"]) == (3, 3, 4)
    monkeypatch.setenv("WORLD_SIZE", "four")
    assert identity()["world_size"] == 1
    assert "$WORLD_SIZE='four' is not a number: recorded as 1" in capsys.readouterr().err
