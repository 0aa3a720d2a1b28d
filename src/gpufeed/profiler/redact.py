"""Redact secrets (keys, tokens, passwords) from argv and environment before anything is written.

What is hidden:
- the value of an option or variable whose name says it is secret, in every spelling: `--token X`,
  `--token=X`, `-p X` and `-pX` (the password of mysql & co), `KEY=X`, `db.password=X`;
- the password of `-u USER:PW` / `--user USER:PW` (curl, wget);
- URL userinfo: a token (`https://***@host`) or the whole password (`https://user:***@host`), also
  when the password holds `/` or `@`;
- secret-named keys inside JSON arguments (`--config '{"password": "X"}'`) and inside `key: value` /
  `key=value` text (query strings, Python or YAML literals);
- `Authorization:`-style headers and `Bearer X`;
- known token shapes (AWS, GitHub, Hugging Face, OpenAI, Slack, JWT) whatever they are called;
- all of the above inside shell strings (`bash -c "python train.py --password X"`), which are split
  with shlex and redacted like argv.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

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
    "pwd",
    "pw",
    "passphrase",
    "credential",
    "credentials",
    "creds",
    "auth",
    "authorization",
    "bearer",
    "jwt",
    "cookie",
    "cookies",
    "signature",
    "sig",
}
# A one-word name is secret where it ends in one of these after one of the owners below
# (`--accesstoken`, `S3_SECRETKEY`, `--clientsecret`, `--hftoken`).
_SECRET_ENDINGS = ("token", "tokens", "secret", "key", "keys", "passwd", "credentials", "creds")
_SECRET_OWNERS = (
    "access",
    "secret",
    "secretaccess",
    "private",
    "api",
    "auth",
    "client",
    "session",
    "refresh",
    "bearer",
    "id",
    "hf",
    "github",
    "gh",
    "wandb",
    "openai",
    "signing",
    "master",
    "encryption",
    "app",
    "db",
    "user",
)
# Names that contain a secret word but are well known not to be secret.
_NOT_SECRET_NAMES = {"PWD"}  # the shell's working directory
# Short options whose value is a secret, apart or glued (`mysql -pPW`, `sshpass -p PW`).
_SECRET_SHORT_OPTIONS = {"-p"}
# Options whose value is USER:PASSWORD (curl, wget): the password after the first colon.
_USERINFO_OPTIONS = {"-u", "--user", "-U", "--proxy-user"}
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
# scheme://REST, REST up to whitespace or a quote (quotes end a URL inside JSON or Python text).
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s\"'<>]*)")
_HOST_PORT = re.compile(r"[^:@]*:\d*")
# `Authorization: X`-style headers: everything after the colon is the secret.
_HEADER = re.compile(
    r"(?i)(?P<head>\b(?:proxy-)?(?:authorization|cookie|x-api-key|x-auth-token)\s*:\s*)"
    r"(?P<value>[^\s\"'][^\n\"']*)"
)
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/=-]+)")
# `key=value` / `key: value` / `"key": "value"` inside text; the key decides (is_secret_name).
_PAIR_KEY = re.compile(r"(?<![\w.])(?P<key>[A-Za-z_][\w.-]*)[\"']?\]?\s*[:=]\s*")
_PAIR_VALUE = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s,;&}\])\"']+")
# What counts as an option or variable name in `NAME=VALUE` (also Hydra's `+db.password=X`).
_OPTION_NAME = re.compile(r"[-+~]*[A-Za-z_][\w.\-/]*")
# An option name a secret-named flag may be followed by instead of its value (`--token --epochs
# 10`); anything else after one (`--hunter2`, `--Xk9!pw`, `--`) is taken as the secret.
_PLAIN_OPTION = re.compile(r"--[a-z]+(?:-[a-z]+)*")
_SHELL_SAFE = re.compile(r"[\w@%+=:,./*-]+")
_NAME_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
_MAX_DEPTH = 4  # nesting of shell strings / JSON inside each other that is looked into

# Environment variables worth keeping in meta.json: they change how training performs.
ENV_PREFIXES = ("CUDA_", "NCCL_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "NVIDIA_", "AWS_", "S3_")


def is_secret_name(name: str) -> bool:
    """True if an option or variable name (e.g. `--api-key`, `AWS_SECRET_ACCESS_KEY`) holds a secret."""
    if name in _NOT_SECRET_NAMES:
        return False
    parts = [p.lower() for p in _NAME_PARTS.split(name) if p]
    return (
        any(p in _SECRET_WORDS or _secret_compound(p) for p in parts) or "password" in name.lower()
    )


def _secret_compound(word: str) -> bool:
    """`word` is a secret word glued to what says whose (`accesstoken`, `secretkey`, `hftoken`);
    not a word that merely ends like one (`monkey`, `hotkey`, `maxtokens`)."""
    return any(
        word.endswith(end) and word[: -len(end)].endswith(_SECRET_OWNERS) for end in _SECRET_ENDINGS
    )


def _is_secret_option(option: str) -> bool:
    """`option` is an argv option or `NAME` of `NAME=VALUE` whose value is a secret."""
    if option in _SECRET_SHORT_OPTIONS:
        return True
    name = option.lstrip("-+~")
    return is_secret_name(name) or (option != name and name.lower() == "pwd")  # `--PWD X`


def redact_value(value: str) -> str:
    """`value` with secrets replaced: URL userinfo, secret keys in JSON or `key=value` text, headers,
    known token shapes, and all of these inside a shell string."""
    return _redact_text(value, 0)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret options (`--token X`, `--token=X`, `-p X`, `-pX`, `KEY=X`),
    the password of `-u USER:PW`, and the secrets `redact_value` finds in any argument (shell
    strings, JSON, URLs) redacted."""
    return _redact_argv(argv, 0)


def redact_env(env: Mapping[str, str], prefixes: tuple[str, ...] = ENV_PREFIXES) -> dict[str, str]:
    """The variables of `env` that start with one of `prefixes`, secret ones redacted."""
    return {
        k: (REDACTED if is_secret_name(k) else redact_value(v))
        for k, v in sorted(env.items())
        if k.startswith(prefixes)
    }


def _redact_argv(argv: Iterable[str], depth: int) -> list[str]:
    out: list[str] = []
    hide_next = user_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next and not _PLAIN_OPTION.fullmatch(arg):  # `--token --epochs 10`: no value
            out.append(REDACTED)
            hide_next = user_next = False
            continue
        if user_next and ":" in arg:  # `curl -u alice:PW`
            out.append(f"{arg.split(':', 1)[0]}:{REDACTED}")
            hide_next = user_next = False
            continue
        hide_next = user_next = False
        name, sep, value = arg.partition("=")
        option_like = bool(sep) and _OPTION_NAME.fullmatch(name) is not None
        if option_like and _is_secret_option(name):
            out.append(f"{name}={REDACTED}")
        elif option_like and name in _USERINFO_OPTIONS and ":" in value:
            out.append(f"{name}={value.split(':', 1)[0]}:{REDACTED}")
        elif arg[:2] in _SECRET_SHORT_OPTIONS and len(arg) > 2 and not sep:  # `-pPW`
            out.append(arg[:2] + REDACTED)
        elif arg[:2] in _USERINFO_OPTIONS and ":" in arg[3:] and not sep:  # `-uUSER:PW`
            out.append(f"{arg.split(':', 1)[0]}:{REDACTED}")
        elif not sep and arg.startswith("-") and _OPTION_NAME.fullmatch(arg):
            hide_next, user_next = _is_secret_option(arg), arg in _USERINFO_OPTIONS
            out.append(arg if hide_next else _redact_text(arg, depth))
        elif option_like:
            out.append(f"{name}={_redact_text(value, depth)}")
        else:
            out.append(_redact_text(arg, depth))
    return out


def _redact_text(text: str, depth: int) -> str:
    """One argument or value: JSON, then shell words, then the patterns on the whole text."""
    text = str(text)
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and depth <= _MAX_DEPTH:
        try:
            obj = json.loads(stripped)
        except ValueError:
            obj = None
        if isinstance(obj, (dict, list)):
            red = _redact_json(obj, depth + 1)
            return text if red == obj else json.dumps(red, ensure_ascii=False)
    if depth < _MAX_DEPTH and any(c.isspace() for c in text):
        words = shell_words(text)  # [] for unbalanced quotes: the patterns below still apply
        if len(words) > 1 or (words and words[0] != text):
            red = _redact_argv(words, depth + 1)
            if red != words:
                text = " ".join(w if _SHELL_SAFE.fullmatch(w) else shlex.quote(w) for w in red)
    text = _URL.sub(_redact_url, text)
    text = _HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group("head") + REDACTED, text)
    text = _redact_pairs(text)
    return _SECRET_VALUES.sub(REDACTED, text)


def shell_words(text: str) -> list[str]:
    """`text` split as a shell would ([] where it cannot be: an unclosed quote)."""
    try:
        return shlex.split(text)
    except ValueError:
        return []


def _redact_json(obj: Any, depth: int) -> Any:
    if isinstance(obj, dict):
        return {
            k: (
                REDACTED
                if is_secret_name(str(k)) and v is not None and not isinstance(v, bool)
                else _redact_json(v, depth)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_redact_json(v, depth) for v in obj]
    if isinstance(obj, str):
        return _redact_text(obj, depth)
    return obj


def _redact_url(m: re.Match[str]) -> str:
    """A URL with the secret part of its userinfo (`token@`, the password of `user:password@`)
    replaced."""
    rest = m.group("rest")
    slash = rest.find("/")
    authority = rest if slash < 0 else rest[:slash]
    if "@" in authority:
        at = authority.rfind("@")
    elif (
        slash >= 0
        and "@" in rest
        and ":" in authority
        and not authority.startswith("[")  # IPv6 host
        and not _HOST_PORT.fullmatch(authority)
    ):
        at = rest.rfind("@")  # `user:pa/ss@host`: a "/" in the password, not a path
    else:
        return m.group(0)
    # `user:password@`: the user name stays (it tells which account), all of the password goes;
    # `token@` (no colon): all of it goes.
    user, colon, _ = rest[:at].partition(":")
    return f"{m.group('scheme')}{user + colon if colon else ''}{REDACTED}{rest[at:]}"


def _redact_pairs(text: str) -> str:
    """`text` with the values of secret keys in `key=value`, `key: value`, `"key": "value"` hidden."""
    out: list[str] = []
    pos = 0
    while (m := _PAIR_KEY.search(text, pos)) is not None:
        value = _PAIR_VALUE.match(text, m.end()) if is_secret_name(m.group("key")) else None
        if value is None or value.group(0) == REDACTED:
            out.append(text[pos : m.end()])
            pos = m.end()
            continue
        quote = value.group(0)[0] if value.group(0)[0] in "\"'" else ""
        out.append(text[pos : m.end()] + quote + REDACTED + quote)
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)
