"""Secrets in argv and environment are redacted before anything is written."""

from __future__ import annotations

import pytest

from gpufeed.profile.redact import REDACTED, is_secret_name, redact_argv, redact_env


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
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["--lr", "--batch-size", "CUDA_VISIBLE_DEVICES", "PWD", "--workers"]
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
