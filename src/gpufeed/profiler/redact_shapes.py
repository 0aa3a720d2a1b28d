"""Secrets known by their shape or by the program they are given to, whatever they are called.

- `hide_shapes`: PEM private key blocks and well-known token prefixes (AWS, GitHub, GitLab,
  Slack, Stripe, Google, OpenAI, Hugging Face, npm, PyPI, SendGrid, JWT) anywhere in a text;
- `pem_spans`: a PEM block split over several arguments (an unquoted `-----BEGIN ... KEY-----`);
- `looks_random`: a value that reads as a key or password (letters and digits mixed at random),
  hidden after an option whose name only resembles a secret one (`--hotkey`, `--bypass`);
- `deleet`: option names spelt with digits or symbols for letters (`--passw0rd`, `--p4$$word`);
- the password options of common command-line tools (`redis-cli -a`, `zip -P`, `ldapsearch -w`,
  `smbclient -U user%PW`, `htpasswd -b FILE USER PW`...): `program_of`, `secret_options`,
  `glued_secret`, `user_separators`, `secret_positions`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "***"

_PEM = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
    r".*?(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.S,
)
# Tokens that are secrets whatever they are called, by their issuer's prefix; not inside a word.
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}"  # AWS access key id
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|gl(?:pat|dt|ptt|rt|cbt|soat)-[A-Za-z0-9_.-]{20,}"  # GitLab
    r"|xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{20,}"  # Stripe
    r"|AIza[0-9A-Za-z_-]{30,}|ya29\.[0-9A-Za-z_-]{20,}|GOCSPX-[0-9A-Za-z_-]{20,}"  # Google
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic (sk-ant-) and other sk- keys
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|npm_[A-Za-z0-9]{36,}|pypi-[A-Za-z0-9_-]{50,}"  # package registries
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"  # SendGrid
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # JWT
    r"|MII[A-Za-z0-9+/]{60,}={0,2}"  # a DER key or certificate in base64 (a PEM block's body)
    r")"
)


def word_set(text: str) -> frozenset[str]:
    """The words of `text`, for the long lists of names below."""
    return frozenset(text.split())


_DELEET = str.maketrans("0134578@$!", "oieastbasi")

# What separates the words of a value (a model id, a path); a random run of characters is a
# secret, a name made of words is not.
_WORD_SEPARATORS = re.compile(r"[-_./:+@,=~]+")
_PLAIN_NUMBER = re.compile(r"[+-]?[\d.,:_/-]*\d[\d.,:_/-]*[a-zA-Z]{0,2}")
_CHAR_RUNS = re.compile(r"[a-z]+|[A-Z]+|\d+|[^a-zA-Z\d]+")
_DIGITS_INSIDE = re.compile(r"(?<=[A-Za-z])\d+(?=[A-Za-z])")
_HEX = re.compile(r"[0-9a-fA-F]{16,}")

# The options whose value is a password, by program (the basename of a word of the command):
# apart (`redis-cli -a PW`) or, for a one-letter option, glued (`-aPW`).
_PROGRAM_OPTIONS: dict[str, frozenset[str]] = {
    program: frozenset(options.split())
    for programs, options in {
        "redis-cli valkey-cli keydb-cli": "-a --pass --askpass-value",
        "zip unzip zipcloak funzip": "-P --password",
        "7z 7za 7zr rar unrar sshpass rdesktop": "-p",
        "mysql mysqldump mysqladmin mysqlimport mysqlshow mysqlcheck mariadb mariadb-dump": "-p",
        "mongo mongosh mongodump mongorestore mongoexport mongoimport mongostat mongotop": "-p",
        "ldapsearch ldapadd ldapmodify ldapdelete ldappasswd ldapwhoami ldapcompare": "-w",
        "sqlcmd bcp osql isql": "-P",
        "openssl": "-passin -passout -pass -password -k",
        "keytool": "-storepass -keypass -srcstorepass -deststorepass -srckeypass -destkeypass",
        "curl": "--pass --proxy-pass",
    }.items()
    for program in programs.split()
}
# Arguments that hold a password after a prefix (`xfreerdp /p:PW`).
_PROGRAM_PREFIXES: dict[str, tuple[str, ...]] = {
    name: ("/p:", "/password:") for name in ("xfreerdp", "wlfreerdp", "sdl-freerdp", "freerdp")
}
# Programs that take `-p` for something else (a port, a folder's parents, preserving modes).
_P_NOT_SECRET = word_set(
    "mkdir cp mv install ssh scp sftp rsync tar ps patch nc ncat git ls du uvicorn gunicorn "
    "jupyter tensorboard torchrun"
)
# User options that take USER<sep>PASSWORD, by program where it differs from ":" and "%"
# (`curl -u user:PW`, `smbclient -U user%PW`, `lftp -u user,PW`).
_USER_SEPARATORS: dict[str, str] = {"lftp": ":%,"}
# Programs that name a secret in a word and give it in the next (`mysqladmin password PW`,
# `aws configure set aws_secret_access_key KEY`).
POSITIONAL_PROGRAMS = frozenset({"mysqladmin", "aws"})
_KNOWN = frozenset(_PROGRAM_OPTIONS) | frozenset(_PROGRAM_PREFIXES) | _P_NOT_SECRET
_KNOWN |= frozenset(_USER_SEPARATORS) | POSITIONAL_PROGRAMS | {"htpasswd", "smbclient"}
_SHELL_BREAKS = frozenset({"&&", "||", ";", "|", "&"})


def hide_shapes(text: str) -> str:
    """`text` with PEM private key blocks and well-known tokens replaced by `REDACTED`."""
    if "-----BEGIN" in text:
        text = _PEM.sub(REDACTED, text)
    return _TOKENS.sub(REDACTED, text)


def pem_spans(words: Sequence[str]) -> set[int]:
    """The indexes of `words` that a PEM private key block split over several words covers
    (`--key -----BEGIN PRIVATE KEY----- MII... -----END PRIVATE KEY-----`, unquoted)."""
    if not any("-----BEGIN" in w for w in words):
        return set()
    starts, pos = [], 0
    for w in words:
        starts.append(pos)
        pos += len(w) + 1
    joined = " ".join(words)
    out: set[int] = set()
    for m in _PEM.finditer(joined):
        out |= {i for i, s in enumerate(starts) if s < m.end() and s + len(words[i]) > m.start()}
    return out if len(out) > 1 else set()  # within one word: hide_shapes does it


def deleet(name: str) -> str:
    """`name` lower-cased with digits and symbols that stand for letters read as letters
    (`passw0rd`, `p4$$word`, `s3cr3t` → `password`, `password`, `secret`)."""
    return name.lower().translate(_DELEET)


def looks_random(value: str) -> bool:
    """Whether `value` reads as a generated key or password: a run of at least 10 characters
    between separators that is hex with digits and letters, has digits between letters twice, or
    changes between cases, digits and symbols at least every other character (`Xk9mQ2vLp8Zr`);
    not a number, path, URL or name made of words (`meta-llama/Llama-2-7b-hf`, `ImageNet1k`)."""
    if not 10 <= len(value) <= 4096 or _PLAIN_NUMBER.fullmatch(value):
        return False
    if value[0] in "/~." or "://" in value or any(c.isspace() for c in value):
        return False
    for chunk in _WORD_SEPARATORS.split(value):
        if len(chunk) < 10:
            continue
        if _HEX.fullmatch(chunk) and not chunk.isdigit() and not chunk.isalpha():
            return True
        if (
            len(_DIGITS_INSIDE.findall(chunk)) >= 2
            or len(_CHAR_RUNS.findall(chunk)) >= len(chunk) / 2
        ):
            return True
    return False


def program_of(word: str) -> str | None:
    """The program `word` names, where it is one whose options redaction knows (`redis-cli`,
    `/usr/bin/zip`), else None."""
    name = word.rsplit("/", 1)[-1].lower().removesuffix(".exe")
    return name if name in _KNOWN else None


def is_break(word: str) -> bool:
    """Whether `word` ends a command in a shell string (`&&`, `;`, `|`...)."""
    return word in _SHELL_BREAKS


def secret_options(program: str | None) -> frozenset[str]:
    """The options whose value is a password for `program`."""
    return _PROGRAM_OPTIONS.get(program or "", frozenset())


def p_is_secret(program: str | None) -> bool | None:
    """Whether `-p VALUE` gives a password: True for the programs whose `-p` does (`sshpass`),
    False for those whose `-p` is a port or a flag (`mkdir`, `ssh`), None when unknown."""
    if "-p" in secret_options(program):
        return True
    return False if program in _P_NOT_SECRET else None


def ordinary(value: str) -> bool:
    """Whether `value` is plainly not a password: a number, a port mapping (`8080:80`), a path."""
    return bool(_PLAIN_NUMBER.fullmatch(value)) or value.startswith(("/", "./", "../", "~/"))


def glued_secret(arg: str, program: str | None) -> str | None:
    """`arg` redacted where it is a password glued to its option for `program` (`-aPW` of
    `redis-cli`, `/p:PW` of `xfreerdp`), else None."""
    if program is None:
        return None
    for prefix in _PROGRAM_PREFIXES.get(program or "", ()):
        if arg.lower().startswith(prefix) and len(arg) > len(prefix):
            return arg[: len(prefix)] + REDACTED
    for option in secret_options(program):
        if len(option) == 2 and arg.startswith(option) and arg[2:] not in ("", REDACTED):
            if arg[2] == "=":  # `-p=PW`: an option and its value, as `--password=PW`
                return None
            return option + REDACTED
    return None


def user_separators(program: str | None) -> str:
    """The characters that part user from password in a USER option's value for `program`."""
    return _USER_SEPARATORS.get(program or "", ":%")


def secret_positions(words: Sequence[str]) -> set[int]:
    """The indexes of `words` that are passwords given as plain arguments: the last of
    `htpasswd -b [-c] FILE USER PASSWORD` (`-nb USER PASSWORD`)."""
    out: set[int] = set()
    if not any("htpasswd" in w for w in words):
        return out
    for i, word in enumerate(words):
        if program_of(word) != "htpasswd":
            continue
        flags, plain = "", []
        for j in range(i + 1, len(words)):
            if is_break(words[j]):
                break
            if words[j].startswith("-") and len(words[j]) > 1:
                flags += words[j][1:]
            else:
                plain.append(j)
        wanted = 2 if "n" in flags else 3
        if "b" in flags and len(plain) >= wanted:
            out.add(plain[wanted - 1])
    return out
