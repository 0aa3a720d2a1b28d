"""Secrets caught by their shape or by the program they are given to, whatever they are called:
PEM blocks, token prefixes, option names in any spelling, the common CLIs' password flags; and
ordinary values (numbers, paths, model names) left alone. The last test plants them in a real
`gpufeed profile` run and looks for them in everything gpufeed writes or prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.profiler.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_value,
)
from gpufeed.profiler.redact_shapes import looks_random

PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7PemBodyLine01"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\nQ2xvc2luZ0xpbmVPZlRoZUtleQ==\n-----END PRIVATE KEY-----"
RSA_BODY = "Rs4BodyOfAnOpenSshKeyThatDoesNotStartWithMii0123456789"
# (argv, the secret that must not survive, an exact expected output or None)
FORMS = [
    (["t.py", "--cert-data", PEM], PEM_BODY, ["t.py", "--cert-data", REDACTED]),
    (["t.py", f"--cert={PEM}"], PEM_BODY, ["t.py", f"--cert={REDACTED}"]),
    (["t.py", "--blob", "-----BEGIN", "OPENSSH", "PRIVATE", "KEY-----", RSA_BODY], RSA_BODY, None),
    (["t.py", "--key", "-----BEGIN RSA PRIVATE KEY-----\\nAbc"], "Abc", None),  # no END line
    (["redis-cli", "-a", "R3disPw9x", "ping"], "R3disPw9x", ["redis-cli", "-a", REDACTED, "ping"]),
    (["/usr/bin/redis-cli", "-aR3disPw9x"], "R3disPw9x", ["/usr/bin/redis-cli", f"-a{REDACTED}"]),
    (["zip", "-P", "Z1pPw9x", "o.zip", "f"], "Z1pPw9x", ["zip", "-P", REDACTED, "o.zip", "f"]),
    (["unzip", "-P", "Z1pPw9x", "o.zip"], "Z1pPw9x", ["unzip", "-P", REDACTED, "o.zip"]),
    (["7z", "x", "-pS7nPw9x", "a.7z"], "S7nPw9x", ["7z", "x", f"-p{REDACTED}", "a.7z"]),
    (["smbclient", "//h/s", "-U", "al%SmbPw9x"], "SmbPw9x", ["smbclient", "//h/s", "-U", "al%***"]),
    (["smbclient", "--user=al%SmbPw9x"], "SmbPw9x", ["smbclient", f"--user=al%{REDACTED}"]),
    (["mysql", "-uroot", "-pMyPw9x"], "MyPw9x", ["mysql", "-uroot", f"-p{REDACTED}"]),
    (["mysql", "--password=MyPw9x"], "MyPw9x", ["mysql", f"--password={REDACTED}"]),
    (["sshpass", "-p", "1234", "ssh", "h"], "1234", ["sshpass", "-p", REDACTED, "ssh", "h"]),
    (["docker", "login", "-p", "DkPw9x"], "DkPw9x", ["docker", "login", "-p", REDACTED]),
    (["curl", "-u", "al:CuPw9x", "h"], "CuPw9x", ["curl", "-u", f"al:{REDACTED}", "h"]),
    (["lftp", "-u", "al,LfPw9x", "h"], "LfPw9x", ["lftp", "-u", f"al,{REDACTED}", "h"]),
    (["ldapsearch", "-x", "-w", "LdPw9x"], "LdPw9x", ["ldapsearch", "-x", "-w", REDACTED]),
    (["sqlcmd", "-U", "sa", "-P", "SqPw9x"], "SqPw9x", ["sqlcmd", "-U", "sa", "-P", REDACTED]),
    (["openssl", "rsa", "-passin", "pass:OsPw9x"], "OsPw9x", ["openssl", "rsa", "-passin", "***"]),
    (["keytool", "-storepass", "KtPw9x"], "KtPw9x", ["keytool", "-storepass", REDACTED]),
    (["htpasswd", "-b", "f", "al", "HtPw9x"], "HtPw9x", ["htpasswd", "-b", "f", "al", REDACTED]),
    (["htpasswd", "-nb", "al", "HtPw9x"], "HtPw9x", ["htpasswd", "-nb", "al", REDACTED]),
    (["xfreerdp", "/u:al", "/p:RdPw9x"], "RdPw9x", ["xfreerdp", "/u:al", f"/p:{REDACTED}"]),
    (["mysqladmin", "password", "MaPw9x"], "MaPw9x", ["mysqladmin", "password", REDACTED]),
    (
        ["aws", "configure", "set", "aws_secret_access_key", "AwPw9x"],
        "AwPw9x",
        ["aws", "configure", "set", "aws_secret_access_key", REDACTED],
    ),
    (["bash", "-c", "PGPASSWORD=PgPw9x psql -h db"], "PgPw9x", None),
    (
        ["SSHPASS=SsPw9x", "sshpass", "-e", "ssh"],
        "SsPw9x",
        [f"SSHPASS={REDACTED}", "sshpass", "-e", "ssh"],
    ),
    (
        ["bash", "-c", "redis-cli -a R3disPw9x ping && zip -P Z1pPw9x o.zip f"],
        "Pw9x",
        ["bash", "-c", f"redis-cli -a {REDACTED} ping && zip -P {REDACTED} o.zip f"],
    ),
    (["t.py", "--passw0rd", "L33tPw9x"], "L33tPw9x", ["t.py", "--passw0rd", REDACTED]),
    (["t.py", "--p4ssword=L33tPw9x"], "L33tPw9x", ["t.py", f"--p4ssword={REDACTED}"]),
    (["t.py", "--pa$$w0rd", "L33tPw9x"], "L33tPw9x", ["t.py", "--pa$$w0rd", REDACTED]),
    (["t.py", "--s3cr3t", "L33tPw9x"], "L33tPw9x", ["t.py", "--s3cr3t", REDACTED]),
    (["t.py", "--pass-phrase", "Phr4se9x"], "Phr4se9x", ["t.py", "--pass-phrase", REDACTED]),
    (["t.py", "--adminpass", "AdPw9x"], "AdPw9x", ["t.py", "--adminpass", REDACTED]),
    (["t.py", "--credentials", "CrPw9x"], "CrPw9x", ["t.py", "--credentials", REDACTED]),
    (["t.py", "+db.passwd=HyPw9x"], "HyPw9x", ["t.py", f"+db.passwd={REDACTED}"]),
    (["t.py", "--hotkey", "Xk9mQ2vLp8Zr4tW7"], "Xk9mQ2vLp8Zr4tW7", ["t.py", "--hotkey", REDACTED]),
    (["t.py", "--bypass=3f9a8b7c6d5e4f3a2b1c"], "3f9a8b7c6d5e4f3a2b1c", None),
    (
        ["t.py", "--config", '{"db": {"passw0rd": "JsPw9x"}, "lr": 0.1}'],
        "JsPw9x",
        ["t.py", "--config", f'{{"db": {{"passw0rd": "{REDACTED}"}}, "lr": 0.1}}'],
    ),
]
TOKENS = [
    "AKIAIOSFODNN7EXAMPLE",
    "ASIAIOSFODNN7EXAMPLE",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "gho_abcdefghijklmnopqrstuvwxyz0123456789",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "glpat-abcdefghij0123456789",
    "xoxb-1234567890-abcdefghijklmnop",
    "xapp-1-A0123456789-abcdefghij",
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "rk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe",
    "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "hf_abcdefghijklmnopqrstuvwxyz01234567",
    "npm_abcdefghijklmnopqrstuvwxyz0123456789",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
]


@pytest.mark.parametrize(("argv", "secret", "expected"), FORMS)
def test_each_covered_form_is_redacted(argv, secret, expected):
    out = redact_argv(argv)
    assert secret not in " ".join(out), out
    if expected is not None:
        assert out == expected
    assert redact_argv(out) == out  # show/report redact again: nothing more changes


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize(
    "where",
    [
        lambda t: ["t.py", "--name", t],
        lambda t: ["t.py", f"--run-label={t}"],
        lambda t: ["bash", "-c", f"python t.py --note {t} --lr 0.1"],
        lambda t: ["t.py", "--config", json.dumps({"label": t, "n": [1, t]})],
        lambda t: ["t.py", f"https://example.com/x?label={t}"],
    ],
)
def test_known_token_shapes_are_hidden_whatever_they_are_called(token, where):
    out = " ".join(redact_argv(where(token)))
    assert token not in out and REDACTED in out


def test_shapes_are_hidden_in_the_environment_and_in_values():
    env = {
        "TORCH_CERT": PEM,
        "NCCL_LABEL": "glpat-abcdefghij0123456789",
        "AWS_PASSW0RD": "hunter2",
        "CUDA_HOTKEY": "Xk9mQ2vLp8Zr4tW7",
        "S3_ENDPOINT": "https://al:S3Pw9x@minio:9000",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "8",
    }
    assert redact_env(env) == {
        "AWS_PASSW0RD": REDACTED,
        "CUDA_HOTKEY": REDACTED,
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_LABEL": REDACTED,
        "OMP_NUM_THREADS": "8",
        "S3_ENDPOINT": f"https://al:{REDACTED}@minio:9000",
        "TORCH_CERT": REDACTED,
    }
    assert redact_value(f"key material: {PEM} (end)") == f"key material: {REDACTED} (end)"


@pytest.mark.parametrize(
    "name",
    [
        *("--passw0rd", "--p4ssword", "--pa$$word", "--p@ssw0rd", "DB_PASSW0RD", "--s3cr3t"),
        *("--t0ken", "--pass-phrase", "--passcode", "-storepass", "SSHPASS", "--adminpass"),
        *("--userpwd", "--pword"),
    ],
)
def test_secret_names_in_any_spelling(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        *("--password-file", "--token-path", "--max-tokens", "--num-tokens", "--tokens-per-batch"),
        *("--key-size", "--token-type", "--secret-name", "--auth-url", "--use-auth", "OLDPWD"),
        *("--tokenizer", "--bypass", "--compass", "--keypoints", "--top5", "--fp16", "PGPASSFILE"),
    ],
)
def test_names_about_a_secret_or_merely_alike_are_not_secret(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py", "--data", "/data/train", "--lr", "0.1", "--epochs", "90"],
        ["t.py", "--model", "resnet50", "--tokenizer", "meta-llama/Llama-2-7b-hf"],
        ["t.py", "--model", "mistralai/Mistral-7B-Instruct-v0.2", "--name", "ImageNetDataset"],
        ["t.py", "--max-tokens", "4096", "--num-tokens=512", "--key-size", "2048"],
        ["t.py", "--password-file", "/run/secrets/db", "--token-path=~/.hf/token"],
        ["t.py", "--hotkey", "ctrl+shift+k", "--sortkey", "created_at", "--keypoints", "17"],
        ["mkdir", "-p", "/data/train/cache"],
        ["docker", "run", "-p", "8080:80", "-p", "127.0.0.1:6006:6006", "img"],
        ["ssh", "-p", "2222", "host"],
        ["t.py", "--task", "task-abcdefghijklmnopqrstuvwxyz", "--run", "ask-me-anything-v2"],
        ["t.py", "--checksum", "sha256:3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "--seed", "1234"],
        ["zip", "-r", "out.zip", "data"],
        ["redis-server", "--port", "6379", "-a", "b"],
        ["t.py", "--config", '{"max_tokens": 512, "token_type": "bearer", "key_path": "/k"}'],
        ["torchrun", "--nproc-per-node", "8", "train.py", "--dist-url", "env://"],
    ],
)
def test_ordinary_values_are_left_alone(argv):
    assert redact_argv(argv) == argv


@pytest.mark.parametrize(
    ("value", "random"),
    [
        ("Xk9mQ2vLp8Zr4tW7", True),
        ("3f9a8b7c6d5e4f3a2b1c0d9e", True),
        ("Tr0ub4dor3xyz", True),
        ("q8Hn3/Zx+T0bWv5kLr9YdJ2mC7pQs4uFe1Gh6iAo", True),  # base64, as AWS secret keys
        ("meta-llama/Llama-2-7b-hf", False),
        ("ImageNetDataset", False),
        ("HuggingFaceH4", False),
        ("resnet50", False),
        ("/data/train/shards", False),
        ("1234567890123", False),
        ("https://example.com/Xk9mQ2vLp8Zr4tW7", False),
        ("bert-base-uncased", False),
        ("created_at_timestamp", False),
    ],
)
def test_looks_random_tells_keys_from_names(value, random):
    assert looks_random(value) is random


# --- the leak test: planted secrets through a real profiled run -----------------------------------

PLANTED_ARGV = [
    *("--cert-data", PEM),
    *("--blob", "-----BEGIN", "OPENSSH", "PRIVATE", "KEY-----", RSA_BODY, "-----END", "OPENSSH"),
    *("PRIVATE", "KEY-----"),
    *("--cmd", "redis-cli -a LeakRedis01 ping"),
    *("--cmd", "zip -P LeakZip02 out.zip f && unzip -P LeakUnzip03 out.zip"),
    *("--cmd", "smbclient //h/s -U al%LeakSmb04"),
    *("--passw0rd", "LeakLeet05", "--p4ssword=LeakLeet06"),
    *("--label", "glpat-LeakGitlab07abcdefghij"),
    *(
        "--stripe",
        "sk_live_LeakStripe08abcdefgh",
        "--maps",
        "AIzaLeakGoogle09abcdefghijklmnopqrstuvw",
    ),
    *("--aws", "AKIALEAKAWS10EXAMPLE", "--gh", "ghp_LeakGithub11abcdefghijklmnop"),
    *("--slack", "xoxb-LeakSlack12-abcdefgh", "--hf", "hf_LeakHuggingFace13abcdefgh"),
    *(
        "--llm",
        "sk-LeakOpenAI14abcdefghijklmn",
        "--sess",
        f"eyJLeakJwt15abcdef.eyJ{'a' * 12}.{'b' * 12}",
    ),
    *("--db", "postgres://al:LeakUrl16@db:5432/x", "--cmd", "mysql -uroot -pLeakMysql17 db"),
    *("--cmd", "sshpass -p LeakSshpass18 ssh h", "--cmd", "curl -u al:LeakCurl19 https://h"),
    *("--cmd", "ldapsearch -x -w LeakLdap20", "--cmd", "sqlcmd -U sa -P LeakSqlcmd21"),
    *(
        "--cmd",
        "openssl rsa -passin pass:LeakOpenssl22",
        "--cmd",
        "keytool -storepass LeakKeytool23",
    ),
    *("--cmd", "htpasswd -b f al LeakHtpasswd24", "--cmd", "lftp -u al,LeakLftp25 h"),
    *("--cmd", "xfreerdp /u:al /p:LeakRdp26", "--cmd", "mysqladmin password LeakMysqladmin27"),
    *("--cmd", "PGPASSWORD=LeakPg28 psql -h db", "--hotkey", "Xk9mLeak29Q2vLp8Zr"),
    *("--config", '{"s3cr3t": "LeakJson30", "lr": 0.1}', "+db.passwd=LeakHydra31"),
    *("-H", "Authorization: Bearer LeakBearer32", "--pass-phrase", "LeakPhrase33"),
    *("--npm", "npm_LeakNpm34abcdefghijklmnopqrstuvwxyz0", "--test-key", "rk_live_LeakStripe35abc"),
]
PLANTED_ENV = {
    "TORCH_CERT_DATA": PEM.replace(PEM_BODY, "MIIEvQIBADANLeakEnvPem36" + "A" * 40),
    "NCCL_LABEL": "glpat-LeakEnvGitlab37abcdef",
    "AWS_PASSW0RD": "LeakEnvLeet38",
    "S3_ENDPOINT_URL": "https://al:LeakEnvUrl39@minio:9000",
    "CUDA_HOTKEY": "Xk9mLeak40Q2vLp8Zr",
}
LEAK_MARKS = [f"Leak{w}" for w in ("Redis01", "Zip02", "Unzip03", "Smb04", "Leet05", "Leet06")]
LEAK_MARKS += ["LeakGitlab07", "LeakStripe08", "LeakGoogle09", "LEAKAWS10", "LeakGithub11"]
LEAK_MARKS += ["LeakSlack12", "LeakHuggingFace13", "LeakOpenAI14", "LeakJwt15", "LeakUrl16"]
LEAK_MARKS += ["LeakMysql17", "LeakSshpass18", "LeakCurl19", "LeakLdap20", "LeakSqlcmd21"]
LEAK_MARKS += ["LeakOpenssl22", "LeakKeytool23", "LeakHtpasswd24", "LeakLftp25", "LeakRdp26"]
LEAK_MARKS += ["LeakMysqladmin27", "LeakPg28", "Leak29", "LeakJson30", "LeakHydra31"]
LEAK_MARKS += ["LeakBearer32", "LeakPhrase33", "LeakNpm34", "LeakStripe35", "LeakEnvPem36"]
LEAK_MARKS += ["LeakEnvGitlab37", "LeakEnvLeet38", "LeakEnvUrl39", "Leak40", PEM_BODY, RSA_BODY]


def test_planted_secrets_reach_no_file_and_no_screen(tmp_path: Path, gpufeed_cli, run_dir_from):
    assert len(LEAK_MARKS) == 42
    env = {**os.environ, **PLANTED_ENV, "COLUMNS": "20000", "NO_COLOR": "1"}
    out = tmp_path / "runs"

    def gpufeed(*args: str) -> str:
        cp = subprocess.run(
            gpufeed_cli(*args), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
        )
        assert cp.returncode == 0, cp.stderr
        return cp.stdout + cp.stderr

    said = gpufeed(
        "profile", "--out", str(out), "--interval", "0.1", "--",
        sys.executable, "-c", "import sys; assert len(sys.argv) > 40", *PLANTED_ARGV,
    )  # fmt: skip
    run_dir = run_dir_from(said)
    assert run_dir is not None, said
    meta = (run_dir / "meta.json").read_text()
    assert "--cert-data" in meta and "TORCH_CERT_DATA" in meta  # the command and env are there
    report = tmp_path / "report.html"
    gpufeed("report", str(run_dir), "--out", str(report))
    shown = {
        "meta.json": meta,
        "show": gpufeed("show", str(run_dir)),
        "ls": gpufeed("ls", str(out)),
        "report.html": report.read_text(),
    }
    assert "--cert-data" in shown["show"] and "--cert-data" in shown["ls"]
    leaks = {(where, mark) for where, text in shown.items() for mark in LEAK_MARKS if mark in text}
    assert not leaks
