"""Redact secrets (keys, tokens, passwords) from argv and environment before anything is written.

What is hidden (the table in docs/reference/reliability.md lists each form):
- the value of an option or variable whose name says it is secret, in every spelling: `--token X`,
  `--token=X`, `KEY=X`, `db.password=X`, `--passw0rd X`, `--pass-phrase X`, `--adminpass X`;
  after a name that only resembles one (`--hotkey`, `--bypass`), a value that reads as a key;
- the password options of common tools: `mysql -pPW`, `sshpass -p PW`, `redis-cli -a PW`,
  `zip -P PW`, `ldapsearch -w PW`, `sqlcmd -P PW`, `openssl -passin pass:PW`, `keytool -storepass`,
  `htpasswd -b FILE USER PW`, `xfreerdp /p:PW`, `mysqladmin password PW`;
- the password of `-u USER:PW` / `--user USER:PW` (curl, wget), `-U USER%PW` (smbclient),
  `lftp -u USER,PW`;
- URL userinfo: a token (`https://***@host`) or the whole password (`https://user:***@host`), also
  when the password holds `/` or `@`;
- secret-named keys inside JSON arguments (`--config '{"password": "X"}'`) and inside `key: value` /
  `key=value` text (query strings, Python or YAML literals);
- `Authorization:`-style headers and `Bearer X`;
- secrets known by their shape whatever they are called (`redact_shapes`): PEM private key blocks
  and well-known token prefixes (AWS, GitHub, GitLab, Slack, Stripe, Google, OpenAI, Hugging Face,
  npm, PyPI, SendGrid, JWT);
- all of the above inside shell strings (`bash -c "python train.py --password X"`), which are split
  with shlex and redacted like argv.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from gpufeed.profiler.redact_shapes import (
    POSITIONAL_PROGRAMS,
    REDACTED,
    deleet,
    glued_secret,
    hide_shapes,
    is_break,
    looks_random,
    ordinary,
    p_is_secret,
    pem_spans,
    program_of,
    secret_options,
    secret_positions,
    user_separators,
    word_set,
)

# Words that, as a part of an option or variable name, mark its value as secret.
_SECRET_WORDS = word_set(
    "key keys apikey token tokens secret secrets password passwd pass pwd pw pword "
    "passphrase passcode passkey credential credentials creds auth authorization bearer jwt "
    "cookie cookies signature sig"
)
# A one-word name is secret where it ends in one of these after one of the owners below
# (`--accesstoken`, `S3_SECRETKEY`, `--clientsecret`, `--hftoken`, `-storepass`, `SSHPASS`).
_SECRET_ENDINGS = ("token", "tokens", "secret", "key", "keys", "passwd", "credentials", "creds")
_SECRET_ENDINGS += ("pass", "pwd")
_SECRET_OWNERS = tuple(
    word_set(
        "access secret secretaccess private api auth client session refresh bearer id hf github "
        "gh wandb openai signing master encryption app db user admin root store key bind ssh "
        "sudo login proxy ftp http smtp mail redis sql ldap vnc"
    )
)
# Name parts that say the value is about a secret, not the secret (`--password-file PATH`,
# `--max-tokens 512`, `--key-size 2048`, `--token-type bearer`, `--use-auth`).
_ABOUT_A_SECRET = word_set(
    "file files path dir folder stdin fd env name type kind mode method scheme url uri "
    "endpoint host port region len length size bits max min num count limit per ttl timeout "
    "version algorithm no use enable disable skip require"
)
# Parts of names that resemble a secret one: their value is hidden where it reads as a key.
_SECRET_STEMS = ("pass", "pwd", "secret", "token", "key", "auth", "cred", "cookie", "bearer")
# Names that contain a secret word but are well known not to be secret.
_NOT_SECRET_NAMES = {"PWD", "OLDPWD"}  # the shell's working directories
# Options whose value is USER<sep>PASSWORD (curl, wget, smbclient): the password after it.
_USERINFO_OPTIONS = {"-u", "--user", "-U", "--proxy-user"}
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
_OPTION_NAME = re.compile(r"[-+~]*[A-Za-z_][\w.\-/$@!]*")  # `$@!`: `--pa$$w0rd`
# An option name a secret-named flag may be followed by instead of its value (`--token --epochs
# 10`); anything else after one (`--hunter2`, `--Xk9!pw`, `--`) is taken as the secret.
_PLAIN_OPTION = re.compile(r"--[a-z]+(?:-[a-z]+)*")
_SHELL_SAFE = re.compile(r"[\w@%+=:,./*-]+")
_NAME_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
_SYMBOLS_AS_LETTERS = str.maketrans("@$!", "asi")  # `p@$$word`, before the name is split
_MAX_DEPTH = 4  # nesting of shell strings / JSON inside each other that is looked into

# Environment variables worth keeping in meta.json: they change how training performs.
ENV_PREFIXES = ("CUDA_", "NCCL_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "NVIDIA_", "AWS_", "S3_")

# What an option asks of the argument after it.
_HIDE, _UNLESS_ORDINARY, _IF_RANDOM, _USER = "hide", "unless ordinary", "if random", "user"


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """True if an option or variable name (e.g. `--api-key`, `AWS_SECRET_ACCESS_KEY`,
    `--passw0rd`) holds a secret; not one that names where or what the secret is
    (`--password-file`, `--max-tokens`)."""
    if name in _NOT_SECRET_NAMES:
        return False
    parts = [p for p in _NAME_PARTS.split(name.translate(_SYMBOLS_AS_LETTERS)) if p]
    words = {p.lower() for p in parts} | {deleet(p) for p in parts}
    if words & _ABOUT_A_SECRET:
        return False
    return any(w in _SECRET_WORDS or _secret_compound(w) for w in words) or any(
        stem in deleet(name) for stem in ("password", "passwd", "passphrase")
    )


@functools.lru_cache(maxsize=4096)
def resembles_secret_name(name: str) -> bool:
    """True if `name` holds a part of a secret word (`--hotkey`, `--bypass`, `--dbsecretx`): its
    value is hidden where it reads as a key (`redact_shapes.looks_random`)."""
    spelt = deleet(name)
    return any(stem in spelt for stem in _SECRET_STEMS)


def _secret_compound(word: str) -> bool:
    """`word` is a secret word glued to what says whose (`accesstoken`, `secretkey`, `hftoken`);
    not a word that merely ends like one (`monkey`, `hotkey`, `maxtokens`, `bypass`)."""
    return any(
        word.endswith(end) and word[: -len(end)].endswith(_SECRET_OWNERS) for end in _SECRET_ENDINGS
    )


def _hides(name: str, value: Any) -> bool:
    """Whether the value of `name` is hidden: always for a secret name, for one that resembles a
    secret name where the value reads as a key."""
    if is_secret_name(name):
        return True
    return isinstance(value, str) and resembles_secret_name(name) and looks_random(value)


def _asks(option: str, program: str | None) -> str:
    """What `option` (of `program`, where known) asks of its value: `_HIDE`, `_UNLESS_ORDINARY`
    (`-p` of an unknown program: not a port or a path), `_IF_RANDOM`, `_USER` or ''."""
    if option in secret_options(program):
        return _HIDE
    if option == "-p":
        secret = p_is_secret(program)
        return _HIDE if secret else "" if secret is False else _UNLESS_ORDINARY
    if option in _USERINFO_OPTIONS:
        return _USER
    name = option.lstrip("-+~")
    if is_secret_name(name) or (option != name and name.lower() == "pwd"):  # `--PWD X`
        return _HIDE
    return _IF_RANDOM if resembles_secret_name(name) else ""


def _answer(asked: str, value: str, program: str | None) -> str | None:
    """`value` redacted as `asked`, or None where it is no secret."""
    if (
        asked == _HIDE
        or (asked == _UNLESS_ORDINARY and not ordinary(value))
        or (asked == _IF_RANDOM and looks_random(value))
    ):
        return REDACTED
    if asked == _USER:
        at = [i for i in map(value.find, user_separators(program)) if i >= 0]
        return f"{value[: min(at) + 1]}{REDACTED}" if at else None
    return None


def redact_value(value: str) -> str:
    """`value` with secrets replaced: URL userinfo, secret keys in JSON or `key=value` text, headers,
    known token shapes and PEM blocks, and all of these inside a shell string."""
    return _redact_text(value, 0)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret options (`--token X`, `--token=X`, `-pX`, `KEY=X`, the
    password options of common tools), the password of `-u USER:PW`, and the secrets
    `redact_value` finds in any argument (shell strings, JSON, URLs, token shapes) redacted."""
    return _redact_argv(argv, 0)


def redact_env(env: Mapping[str, str], prefixes: tuple[str, ...] = ENV_PREFIXES) -> dict[str, str]:
    """The variables of `env` that start with one of `prefixes`, secret ones redacted."""
    return {
        k: (REDACTED if _hides(k, v) else redact_value(v))
        for k, v in sorted(env.items())
        if k.startswith(prefixes)
    }


def _redact_argv(argv: Iterable[str], depth: int) -> list[str]:
    words = [str(a) for a in argv]
    hidden = pem_spans(words) | secret_positions(words)
    out: list[str] = []
    program: str | None = None
    asked = ""  # what the previous argument, an option, asks of this one
    for i, arg in enumerate(words):
        if i in hidden:
            out.append(REDACTED)
            asked = ""
            continue
        if asked and not _PLAIN_OPTION.fullmatch(arg):  # `--token --epochs 10`: no value
            answer = _answer(asked, arg, program)
            asked = ""
            if answer is not None:
                out.append(answer)
                continue
        asked = ""
        if is_break(arg):
            program = None
        elif not arg.startswith("-") and (named := program_of(arg)) is not None:
            program = named
        out.append(_redact_arg(arg, program, depth))
        if arg.startswith("-") and _OPTION_NAME.fullmatch(arg) and out[-1] == arg:
            asked = _asks(arg, program)
        elif program in POSITIONAL_PROGRAMS and _OPTION_NAME.fullmatch(arg) and is_secret_name(arg):
            asked = _HIDE  # `mysqladmin password PW`, `aws configure set aws_secret_access_key K`
    return out


def _redact_arg(arg: str, program: str | None, depth: int) -> str:
    """One argument of `program`'s command line, seen alone (the option before it aside)."""
    if arg in secret_options(program):
        return arg
    glued = glued_secret(arg, program)
    if glued is not None:  # `redis-cli -aPW`, `xfreerdp /p:PW`
        return glued
    name, sep, value = arg.partition("=")
    if sep and _OPTION_NAME.fullmatch(name):
        answer = _answer(_asks(name, program), value, program)
        return f"{name}={answer if answer is not None else _redact_text(value, depth)}"
    if arg[:2] == "-p" and len(arg) > 2 and _OPTION_NAME.fullmatch(arg):  # `mysql -pPW`
        secret = p_is_secret(program)
        if secret or (secret is None and not ordinary(arg[2:])):
            return "-p" + REDACTED
    if arg[:2] in _USERINFO_OPTIONS and len(arg) > 2:  # `-uUSER:PW`
        answer = _answer(_USER, arg[2:], program)
        if answer is not None:
            return arg[:2] + answer
    if arg.startswith("-") and _OPTION_NAME.fullmatch(arg):
        return arg
    return _redact_text(arg, depth)


def _redact_text(text: str, depth: int) -> str:
    """One argument or value: shapes, JSON, then shell words, then the patterns on the whole text."""
    text = hide_shapes(str(text))
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
                text = " ".join(
                    w if _SHELL_SAFE.fullmatch(w) or is_break(w) else shlex.quote(w) for w in red
                )
    text = _URL.sub(_redact_url, text)
    text = _HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group("head") + REDACTED, text)
    return _redact_pairs(text)


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
                if _hides(str(k), v) and v is not None and not isinstance(v, bool)
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
        key = m.group("key")
        value = _PAIR_VALUE.match(text, m.end()) if resembles_secret_name(key) else None
        if value is not None and not _hides(key, value.group(0).strip("\"'")):
            value = None
        if value is None or value.group(0).strip("\"'") == REDACTED:
            out.append(text[pos : m.end()])
            pos = m.end()
            continue
        quote = value.group(0)[0] if value.group(0)[0] in "\"'" else ""
        out.append(text[pos : m.end()] + quote + REDACTED + quote)
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)
