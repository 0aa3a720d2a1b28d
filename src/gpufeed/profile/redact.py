"""Redact secrets (keys, tokens, passwords) from argv and environment before anything is written."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "***"

# Words that, as a part of an option or variable name, mark its value as secret.
_SECRET_WORDS = {
    "key",
    "keys",
    "apikey",
    "token",
    "tokens",
    "secret",
    "secrets",
    "password",
    "passwd",
    "pass",
    "passphrase",
    "credential",
    "credentials",
    "auth",
    "signature",
}
# Values that are secrets whatever they are called.
_SECRET_VALUES = re.compile(
    r"(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub token
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face token
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI-style key
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack token
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # JWT
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*:)[^@/\s]+(?=@)")
_NAME_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")

# Environment variables worth keeping in meta.json: they change how training performs.
ENV_PREFIXES = ("CUDA_", "NCCL_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "NVIDIA_", "AWS_", "S3_")


def is_secret_name(name: str) -> bool:
    """True if an option or variable name (e.g. `--api-key`, `AWS_SECRET_ACCESS_KEY`) holds a secret."""
    parts = [p.lower() for p in _NAME_PARTS.split(name) if p]
    return any(p in _SECRET_WORDS for p in parts) or "password" in name.lower()


def redact_value(value: str) -> str:
    """`value` with known secret shapes and URL passwords replaced."""
    value = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)
    return _SECRET_VALUES.sub(REDACTED, value)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret options (`--token X`, `--token=X`, `KEY=X`) and secret shapes redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, sep, _ = arg.partition("=")
        if sep and is_secret_name(name.lstrip("-")):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and not sep and is_secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
        else:
            out.append(redact_value(arg))
    return out


def redact_env(env: Mapping[str, str], prefixes: tuple[str, ...] = ENV_PREFIXES) -> dict[str, str]:
    """The variables of `env` that start with one of `prefixes`, secret ones redacted."""
    return {
        k: (REDACTED if is_secret_name(k) else redact_value(v))
        for k, v in sorted(env.items())
        if k.startswith(prefixes)
    }
