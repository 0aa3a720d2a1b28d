"""Secrets in argv and environment are redacted before anything is written."""

from __future__ import annotations

import json

import pytest

from gpufeed.profiler.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_value,
)


@pytest.mark.parametrize(
    "name",
    [
        "--api-key",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "--password",
        "db.passwd",
        "apiKey",
        "GITHUB_TOKEN",
        "--pwd",
        "DB_PWD",
        "--bearer",
        "X-Amz-Signature",
        "--accesstoken",
        "S3_SECRETKEY",
        "--clientsecret",
        "--APITOKEN",
        "--privatekey",
        "--creds",
        "--hftoken",
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "--lr",
        "--batch-size",
        "CUDA_VISIBLE_DEVICES",
        "PWD",
        "--workers",
        "--tokenizer",
        "--bypass",
        "--monkey",
        "--hotkey",
        "--sortkey",
        "--maxtokens",
        "--ntokens",
        "--imagekey",
    ],
)
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_redact_argv_hides_values_of_secret_options_in_every_form():
    argv = ["train.py", "--token", "abc123", "--api_key=xyz", "db.password=pw", "--lr", "0.1"]
    assert redact_argv(argv) == [
        "train.py",
        "--token",
        REDACTED,
        f"--api_key={REDACTED}",
        f"db.password={REDACTED}",
        "--lr",
        "0.1",
    ]


def test_a_secret_named_flag_without_a_value_never_hides_the_next_option():
    argv = ["t.py", "--token", "--epochs", "10", "--token", "abc"]
    assert redact_argv(argv) == ["t.py", "--token", "--epochs", "10", "--token", "***"]


@pytest.mark.parametrize("value", ["--hunter2", "--Xk9!pw", "--"])
def test_a_secret_that_starts_with_dashes_is_still_hidden(value):
    # only a plain option name (--epochs) after a secret-named flag is taken as no value
    assert redact_argv(["mysql", "-p", value, "db"]) == ["mysql", "-p", REDACTED, "db"]
    assert redact_argv(["t.py", "--password", value]) == ["t.py", "--password", REDACTED]


def test_a_secret_assigned_by_subscript_in_code_is_hidden():
    code = "import os; os.environ['WANDB_API_KEY'] = '0123456789abcdef0123'; print('ok')"
    out = redact_argv(["python", "-c", code])
    assert "0123456789abcdef0123" not in " ".join(out)
    assert "print('ok')" in out[2]


def test_redact_argv_hides_secret_shapes_whatever_they_are_called():
    argv = ["--src", "s3://AKIAIOSFODNN7EXAMPLE@bucket", "--url", "https://bob:s3cr3t@127.0.0.1/x"]
    out = redact_argv(argv)
    assert "AKIAIOSFODNN7EXAMPLE" not in " ".join(out)
    assert out[3] == f"https://bob:{REDACTED}@127.0.0.1/x"


def test_redact_env_keeps_relevant_variables_and_hides_secrets():
    env = {
        "AWS_SECRET_ACCESS_KEY": "x" * 40,
        "AWS_REGION": "eu-west-1",
        "OMP_NUM_THREADS": "4",
        "HOME": "/root",
    }
    assert redact_env(env) == {
        "AWS_REGION": "eu-west-1",
        "AWS_SECRET_ACCESS_KEY": REDACTED,
        "OMP_NUM_THREADS": "4",
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["mysql", "-p", "Pw9x"], ["mysql", "-p", REDACTED]),
        (["mysql", "-p=Pw9x"], ["mysql", f"-p={REDACTED}"]),
        (["mysql", "-uroot", "-pPw9x", "db"], ["mysql", "-uroot", f"-p{REDACTED}", "db"]),
        (["curl", "-u", "alice:Pw9x", "h"], ["curl", "-u", f"alice:{REDACTED}", "h"]),
        (["curl", "-ualice:Pw9x"], ["curl", f"-ualice:{REDACTED}"]),
        (["curl", "--user=alice:Pw9x"], ["curl", f"--user=alice:{REDACTED}"]),
        (["wget", "--proxy-user", "al:Pw9x"], ["wget", "--proxy-user", f"al:{REDACTED}"]),
        (["bash", "-c", "curl -u al:Pw9x h"], ["bash", "-c", f"curl -u al:{REDACTED} h"]),
        (["--pwd", "Pw9x"], ["--pwd", REDACTED]),
        (["--db-pwd=Pw9x"], [f"--db-pwd={REDACTED}"]),
        (["--bearer", "Tk7z"], ["--bearer", REDACTED]),
        (["--jwt", "Tk7z"], ["--jwt", REDACTED]),
        (
            ["--config", '{"password": "Pw9x", "lr": 0.1}'],
            ["--config", f'{{"password": "{REDACTED}", "lr": 0.1}}'],
        ),
        (
            ['--config={"db": {"password": "Pw9x"}}'],
            [f'--config={{"db": {{"password": "{REDACTED}"}}}}'],
        ),
        (
            ["--opts", "{'password': 'Pw9x', 'lr': 0.1}"],
            ["--opts", f"{{'password': '{REDACTED}', 'lr': 0.1}}"],
        ),
        (["https://Tk7z@host/repo.git"], [f"https://{REDACTED}@host/repo.git"]),
        (["https://u:Pw9x/Pw9x@h"], [f"https://u:{REDACTED}@h"]),
        (["https://u:Pw9x/Pw9x@h/data"], [f"https://u:{REDACTED}@h/data"]),
        (["https://u:Pw9x@Pw9x@h"], [f"https://u:{REDACTED}@h"]),
        (["--src=s3://Tk7z@bucket/x"], [f"--src=s3://{REDACTED}@bucket/x"]),
        (["https://h/x?access_token=Tk7z&n=1"], [f"https://h/x?access_token={REDACTED}&n=1"]),
        (
            ["bash", "-c", "python train.py --password Pw9x --name 'my run'"],
            ["bash", "-c", f"python train.py --password {REDACTED} --name 'my run'"],
        ),
        (
            ["bash", "-c", "python train.py --token=Tk7z -p Pw9x"],
            ["bash", "-c", f"python train.py --token={REDACTED} -p {REDACTED}"],
        ),
        (
            ["sh", "-c", 'bash -c "python t.py --api-key Pw9x"'],
            ["sh", "-c", f"bash -c 'python t.py --api-key {REDACTED}'"],
        ),
        (["bash", "-c", "HF_TOKEN=Tk7z python t.py"], ["bash", "-c", f"HF_TOKEN={REDACTED}"]),
        (["-H", "Authorization: token Tk7z"], ["-H", f"Authorization: {REDACTED}"]),
        (["-H", "Authorization: Bearer Tk7z"], ["-H", f"Authorization: {REDACTED}"]),
    ],
)
def test_redact_argv_covers_every_spelling(argv, expected):
    out = redact_argv(argv)
    assert out == expected
    assert "Pw9x" not in " ".join(out) and "Tk7z" not in " ".join(out)
    assert redact_argv(out) == out  # redacting twice changes nothing (show/report redact again)


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py", "--lr", "0.1", "--data=/data/x", "--workers", "8"],
        ["--config", '{"lr": 0.1,  "layers": [1, 2]}'],  # untouched JSON keeps its formatting
        ["bash", "-c", "python train.py --epochs 3 && echo 'done it'"],
        ["--msg", "it's unbalanced"],
        ["pip", "install", "git+https://github.com/org/repo@v1.0"],
        ["http://localhost:8080/a@b", "http://[::1]:8080/a@b"],
        ["PWD=/root", "--port", "8080", "--use-auth"],
        ["python", "-u", "train.py", "--user", "alice"],  # unbuffered; a user name alone
    ],
)
def test_redact_argv_leaves_ordinary_arguments_alone(argv):
    assert redact_argv(argv) == argv


def test_redact_argv_json_keeps_structure_and_hides_whole_secret_subtrees():
    config = {"auth": {"user": "a", "x": "b"}, "use_token": True, "cmd": "x --token TOK", "n": 1}
    out = json.loads(redact_argv(["--config", json.dumps(config)])[1])
    assert out == {"auth": REDACTED, "use_token": True, "cmd": f"x --token {REDACTED}", "n": 1}


def test_redact_value_hides_url_userinfo_and_secret_pairs():
    assert redact_value("mysql://root:p@w@db:3306/x") == f"mysql://root:{REDACTED}@db:3306/x"
    assert redact_value("password: PW") == f"password: {REDACTED}"
