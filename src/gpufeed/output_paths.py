"""Output paths checked before a command does any work: a file that is a folder, a path under a
file, a missing folder, a profiled run's own data files, two options naming one file. Each refusal
is a GpufeedError that names the option and says what to give instead."""

from __future__ import annotations

import os
import re

from gpufeed.errors import GpufeedError


def check_output_file(
    option: str, path: str | None, make_parents: bool = False, example: str = ""
) -> None:
    """Refuse, before any work or any other file is written, an output file that cannot be: an
    existing folder, a path under a file, or (unless the command creates folders) a missing
    folder. `example`: the file name to suggest in a folder (the command's default's name)."""
    if path is None:
        return
    if not path.strip():
        raise GpufeedError(
            f"{option} {path!r}: give a file name, e.g. {option} {example or _example(option)}"
        )
    if os.path.isdir(path):
        raise GpufeedError(
            f"{option} {path} is a folder: give a file name in it, "
            f"e.g. {option} {os.path.join(path, example or _example(option))}"
        )
    _check_ancestors(option, path)
    folder = os.path.dirname(os.path.abspath(path))
    if _run_data(folder, os.path.basename(path)):
        suggest = os.path.join(os.path.dirname(path), example or _example(option))
        raise GpufeedError(
            f"{option} {path} is a file of the run recorded in {folder}: writing it would destroy "
            f"the run; give another file, e.g. {option} {suggest}"
        )
    if not make_parents and not os.path.isdir(folder):
        raise GpufeedError(
            f"{option} {path}: folder {os.path.dirname(path) or '.'} does not exist; create it first"
        )


def _run_data(folder: str, name: str) -> bool:
    """Whether `name` in `folder` is (or would be) a profiled run's own data: its meta.json or
    a store (`*.db` and SQLite's journals), in a folder holding a meta.json."""
    if not os.path.isfile(os.path.join(folder, "meta.json")):  # profiler.session.META_FILE
        return False
    return name == "meta.json" or re.search(r"\.db(-wal|-shm|-journal)?$", name) is not None


def check_output_dir(option: str, path: str | None) -> None:
    """Refuse, before any work, an output folder that is a file or lies under one."""
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise GpufeedError(f"{option} {path} is a file, not a folder: give a folder to write into")
    _check_ancestors(option, path)


def _check_ancestors(option: str, path: str) -> None:
    """Refuse a path whose nearest existing parent is a file (`train.py/out.json`)."""
    parent = os.path.dirname(os.path.normpath(path))
    while parent and not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if parent and os.path.exists(parent) and not os.path.isdir(parent):
        raise GpufeedError(
            f"{option} {path}: {parent} is a file, not a folder; give a path in a folder"
        )


def check_distinct(*outputs: tuple[str, str | None]) -> None:
    """Refuse two options that name the same output file (the second would overwrite the first)."""
    seen: dict[str, str] = {}
    for option, path in outputs:
        if path:
            key = os.path.realpath(path)
            if key in seen:
                raise GpufeedError(f"{seen[key]} and {option} both name {path}: give two files")
            seen[key] = option


def _example(option: str) -> str:
    """A file name to suggest for `option`."""
    return "findings.json" if option == "--json" else "out.json"
