"""Shard URLs as given (brace patterns, directories, remote prefixes) into the list of shards and
the directory their index lives in. The training read path (`dataset`) and `gpufeed index`
(`indexer`) both name shards this way, so it lives below both."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufeed.data.destination import Destination
from gpufeed.data.index_file import check_shard_name
from gpufeed.data.location import is_remote
from gpufeed.data.shards import ShardError

MAX_SHARDS = 1_000_000  # names one list of shard URLs may hold (more is a typo'd range)


def expand_urls(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    must_exist: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Shard URLs or paths with brace ranges expanded (`shards-{000000..000099}.tar`), in order;
    a local directory stands for the .tar files in it. Patterns naming more than MAX_SHARDS
    shards are refused before anything is expanded; with `must_exist`, the first local shard
    that is not there is a ShardError at once, and a remote prefix (a URL neither a pattern nor
    a .tar) stands for the .tar files under it, as a local directory does."""
    from braceexpand import braceexpand

    items = [str(u) for u in ([urls] if isinstance(urls, (str, os.PathLike)) else list(urls))]
    try:
        total = sum(brace_count(item) for item in items)
    except ValueError as e:
        raise ShardError(f"bad brace pattern: {e}; write ranges as name-{{000..099}}.tar") from None
    if total > MAX_SHARDS:
        raise ShardError(
            f"{' '.join(items)} names {total:,} shards, more than the {MAX_SHARDS:,} gpufeed "
            "takes at once: check the brace range (one digit too many?), or index the shards "
            "in parts"
        )
    out: list[str] = []
    for item in items:
        for u in braceexpand(item):
            if not is_remote(u) and os.path.isdir(u):  # a local directory: its .tar files
                found = sorted(str(p) for p in Path(u).glob("*.tar"))
                if not found:
                    raise ShardError(f"{u} is a directory without .tar files: name the shards")
                out += found
            elif must_exist and is_remote(u) and not is_shard_pattern(item):
                out += _remote_tars(u, storage_options)
            elif must_exist and not is_remote(u) and not os.path.exists(u):
                folder = os.path.dirname(u) or "."
                where = "" if os.path.isdir(folder) else f": there is no folder {folder}"
                raise ShardError(f"shard {u} not found{where}")
            else:
                out.append(u)
            if len(out) > MAX_SHARDS:
                raise ShardError(
                    f"{item} names more than {MAX_SHARDS:,} shards (with the .tar files of "
                    "its directories): index the shards in parts"
                )
    return out


def _remote_tars(url: str, storage_options: dict[str, Any] | None) -> list[str]:
    """The .tar files directly under remote prefix `url`, sorted (one listing); [url] itself
    when it names a file (a compressed shard, say: reading it says what is wrong)."""
    folder = Destination(url, storage_options)
    listed = folder.sizes()
    if not url.endswith("/") and list(listed) == [folder.url.rsplit("/", 1)[-1]]:
        return [url]
    found = sorted(name for name in listed if name.endswith(".tar"))
    if not found:
        raise ShardError(
            f"{url} is a folder without .tar files: name the shards, e.g. "
            f"'{folder.url}/train-{{000000..000099}}.tar'"
        )
    return [folder.path(name) for name in found]


def brace_count(pattern: str) -> int:
    """How many names `braceexpand(pattern)` yields, counted without expanding them (braceexpand
    holds every name of a range in memory); a ValueError for unbalanced braces."""
    from braceexpand import alphabet, char_range_re, int_range_re

    def expression(expr: str) -> int:
        m = int_range_re.match(expr)
        if m:
            first, last, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1) or 1
            if first < last:
                return len(range(first, last + 1, step))
            return len(range(first, last - 1, -step))
        m = char_range_re.match(expr)
        if m:
            first, last = alphabet.index(m.group(1)), alphabet.index(m.group(2))
            step = int(m.group(3) or 1) or 1
            if first < last:
                return len(alphabet[first : last + 1 : step])
            return len(alphabet[first : (last or -len(alphabet)) - 1 : -step])
        parts = sequence(expr)
        return pattern_(expr) if parts is None else sum(pattern_(p) for p in parts)

    def sequence(seq: str) -> list[str] | None:  # the comma-separated parts; None if no comma
        parts, start, pos, depth = [], 0, 0, 0
        while pos < len(seq):
            if seq[pos] == "\\":
                pos += 2
                continue
            if seq[pos] == "{":
                depth += 1
            elif seq[pos] == "}":
                depth -= 1
            elif seq[pos] == "," and depth == 0:
                parts.append(seq[start:pos])
                start = pos + 1
            pos += 1
        if depth != 0 or not parts:
            return None
        return [*parts, seq[start:]]

    def pattern_(text: str) -> int:
        n, start, pos, depth = 1, 0, 0, 0
        while pos < len(text):
            if text[pos] == "\\":
                pos += 2
                continue
            if text[pos] == "{":
                if depth == 0:
                    start = pos
                depth += 1
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    n *= expression(text[start + 1 : pos])
            pos += 1
        if depth != 0:
            raise ValueError(f"Unbalanced braces: '{text}'")
        return n

    return pattern_(pattern)


def is_shard_pattern(url: str | os.PathLike[str]) -> bool:
    """True for a brace pattern or a path ending in .tar (shards named one by one, not a directory)."""
    return "{" in str(url) or str(url).rstrip("/").endswith(".tar")


def split_shards(urls: Sequence[str]) -> tuple[str, list[str]]:
    """(the directory holding every shard, their names relative to it); the index lives there."""
    if not urls:
        raise ShardError("no shards given: name them, e.g. 'shards-{000000..000099}.tar'")
    remote = {is_remote(u) for u in urls}
    if len(remote) > 1:
        raise ShardError("shards are partly local, partly remote: give them in one place")
    norm = list(urls) if remote == {True} else [os.path.abspath(u) for u in urls]
    base = posixpath.dirname(norm[0])
    while any(not u.startswith(base + "/") for u in norm):
        parent = posixpath.dirname(base)
        if parent == base or base.endswith("://") or "/" not in base.split("://")[-1]:
            raise ShardError(f"shards {urls[0]} and others share no directory to index them in")
        base = parent
    names = [u[len(base) + 1 :] for u in norm]
    for name in names:
        check_shard_name(name)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ShardError(f"shard {base}/{dup} is named twice")
    return base, names
