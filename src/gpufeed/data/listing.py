"""What an image folder or list file holds for `gpufeed pack`: the images (path, sample key,
label), the class names, and every input skipped on the way with why (see `gpufeed.data.packing`
for the policy). Listing opens no image; converting them is `gpufeed.data.convert`'s."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from gpufeed.data.index_file import MAX_LABEL
from gpufeed.data.location import is_remote
from gpufeed.data.pack_errors import PackError
from gpufeed.text import valid_text, visible

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})


@dataclass(frozen=True)
class Item:
    """One image to pack: its path, its sample key in the shards and its class id."""

    path: str
    key: str
    label: int


def _key_for(rel: str) -> str:
    """The sample key of relative name `rel`: its path without the extension, in letters, digits,
    `_` and `-` (what every WebDataset reader accepts); where two names give one key, the later
    one gets a hash of its name added."""
    stem = rel.rsplit(".", 1)[0] if "." in Path(rel).name else rel
    return re.sub(r"[^A-Za-z0-9_-]", "_", stem).strip("_") or "x"


def special(st: os.stat_result) -> str:
    """What a non-regular file is, for the skipped list."""
    for test, what in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(st.st_mode):
            return what
    return "not a regular file"


def _walk_class(root: Path, d: Path, skipped: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(path, relative name, class) of every regular file under class folder `d`; every other
    entry (unreadable folder, broken or folder symlink, FIFO...) goes to `skipped`; hidden files
    and folders are ignored."""
    rows: list[tuple[str, str, str]] = []

    def unreadable(e: OSError) -> None:
        skipped.append((str(e.filename or d), f"unreadable folder: {e.strerror or e}"))
        warnings.warn(
            f"{visible(e.filename or d)}: unreadable folder ({e.strerror or e}), its images are not "
            "packed; fix its permissions and pack again",
            stacklevel=3,
        )

    for top, dirs, files in os.walk(d, onerror=unreadable):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(top, name)):
                skipped.append((os.path.join(top, name), "symbolic link to a folder: not followed"))
        dirs[:] = sorted(
            n for n in dirs if not n.startswith(".") and not os.path.islink(os.path.join(top, n))
        )
        for name in sorted(n for n in files if not n.startswith(".")):
            path = os.path.join(top, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                skipped.append((path, "broken symbolic link"))
                continue
            except OSError as e:
                skipped.append((path, f"unreadable: {e.strerror or e}"))
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append((path, f"{special(st)}, not an image file"))
                continue
            rows.append((path, os.path.relpath(path, root), d.name))
    return rows


def _read_list(src: Path) -> str:
    """The text of list file `src`, or a PackError when it is unreadable or binary."""
    try:
        data = src.read_bytes()
    except OSError as e:
        raise PackError(
            f"cannot read list file {src}: {e.strerror or e}; check that it is a readable file"
        ) from None
    if b"\0" in data[:65536]:
        raise PackError(
            f"list file {src} is binary, not text: give an image folder or a text file of "
            "'PATH LABEL' lines"
        )
    return data.decode("utf-8", errors="surrogateescape")  # non-UTF-8 paths still open


def _list_labels(src: Path, labels: list[tuple[int, str]]) -> list[str]:
    """Class names for the labels of a list file: numbers 0..max when every label is a number
    (a negative or absurdly large one is a PackError naming its line), else the sorted names.
    Numbers beside a few names (a header line, `path,label`) are a PackError naming the line:
    read as names, 2 and 10 would sort as '10' < '2' and every label would change."""
    numeric = [re.fullmatch(r"[+-]?\d+", x) is not None for _, x in labels]
    if any(numeric) and not all(numeric) and sum(numeric) > len(numeric) // 2:
        n, x = next(label for label, ok in zip(labels, numeric, strict=True) if not ok)
        raise PackError(
            f"{src}:{n}: label {x!r} is not a number, but {sum(numeric):,} other lines' labels "
            "are class numbers (a header line?): delete the line or start it with #"
        )
    if not labels or not all(numeric):
        return sorted({x for _, x in labels})
    for n, x in labels:
        if int(x) < 0:
            raise PackError(
                f"{src}:{n}: label {x} is negative: numeric labels are class numbers 0, 1, 2, ...; "
                "fix the line or use class names"
            )
        if int(x) > MAX_LABEL:
            raise PackError(
                f"{src}:{n}: label {x} is over {MAX_LABEL:,}: numeric labels are class numbers "
                "0..N-1 (is the column order PATH LABEL?); fix the line or use class names"
            )
    return [str(i) for i in range(max(int(x) for _, x in labels) + 1)]


def _split_line(line: str, base: Path) -> tuple[Path, str] | None:
    """(path, label) of a list-file line: the label is the last field, after a tab, a comma or
    spaces; paths may hold commas and spaces. A line with both a comma and spaces splits where
    the path names a file (`a,b.jpg cat`, `c d.jpg,dog`), else at the last comma."""
    if "\t" in line:
        splits = [line.rpartition("\t")[::2]]
    else:
        splits = [line.rpartition(",")[::2]] if "," in line else []
        spaced = re.fullmatch(r"(.*?\S)\s+(\S+)", line)
        if spaced and not spaced[2].startswith(","):
            splits.append((spaced[1].rstrip(","), spaced[2]))
    found = []
    for path, label in splits:
        path, label = path.strip(), label.strip()
        if path and label:
            full = Path(path) if Path(path).is_absolute() else base / path
            found.append((full, label))
    if len(found) > 1:
        return next((f for f in found if os.path.lexists(f[0])), found[0])
    return found[0] if found else None


def list_inputs(
    src: str | os.PathLike[str],
) -> tuple[list[Item], list[str], list[tuple[str, str]]]:
    """Items (path, key, label), class names, and (path, reason) rows skipped while listing."""
    if is_remote(os.fspath(src)):  # before Path(), which makes `s3://b/x` a local `s3:/b/x`
        raise PackError(
            f"SRC {visible(os.fspath(src))} is a URL: SRC must be a local folder or a list "
            f"file of local images; {_COPY_FIRST} and pack that folder"
        )
    src = Path(src)
    skipped: list[tuple[str, str]] = []
    rows: list[tuple[str, str, str]] = []  # (path, relative name, class)
    if src.is_dir():
        try:
            entries = sorted(src.iterdir())
        except OSError as e:
            raise PackError(
                f"cannot read SRC folder {src}: {e.strerror or e}; check its permissions"
            ) from None
        class_dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
        if not class_dirs:
            raise PackError(f"{src} has no class sub-folders: expected SRC/<class>/<image> files")
        for p in entries:
            if p not in class_dirs and not p.name.startswith("."):
                broken = p.is_symlink() and not p.exists()  # a class folder's link, maybe
                skipped.append(
                    (str(p), "broken symbolic link" if broken else "not in a class sub-folder")
                )
        for d in class_dirs:
            rows += _walk_class(src, d, skipped)
        classes = [d.name for d in class_dirs]
    elif src.is_file():
        labels: list[tuple[int, str]] = []
        for n, line in enumerate(_read_list(src).splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if is_remote(line):
                raise PackError(
                    f"{visible(src)}:{n}: '{visible(line)}' names a URL: a list file "
                    f"must name local image files; {_COPY_FIRST} and list their local paths"
                )
            parts = _split_line(line, src.parent)
            if parts is None:
                skipped.append((f"{src}:{n}", "malformed line: expected 'PATH LABEL'"))
                continue
            rows.append((str(parts[0]), "", parts[1]))
            labels.append((n, parts[1]))
        if rows:  # keys: paths relative to the deepest folder holding all listed files
            common = os.path.commonpath([os.path.dirname(os.path.abspath(r[0])) for r in rows])
            rows = [(p, os.path.relpath(os.path.abspath(p), common), c) for p, _, c in rows]
        classes = _list_labels(src, labels)
    elif src.exists():
        raise PackError(
            f"SRC {src} is neither a folder nor a regular file: give an image folder or a list file"
        )
    else:
        raise PackError(f"SRC {src} does not exist: give an image folder or a list file")
    class_index = {c: i for i, c in enumerate(classes)}
    classes = _class_names(src, classes)
    items: list[Item] = []
    seen_paths: set[str] = set()
    seen_keys: dict[str, str] = {}
    for path, rel, cls in rows:
        if path in seen_paths:
            skipped.append((path, "listed twice; first entry kept"))
            continue
        seen_paths.add(path)
        key = _key_for(rel)
        if key in seen_keys:  # another name cleaned to the same key: a.jpg, a.jpeg, "a b", 猫
            key = f"{key}_{hashlib.blake2b(_as_bytes(rel), digest_size=5).hexdigest()}"
        if key in seen_keys:
            skipped.append((path, f"duplicate key {key!r} (same as {seen_keys[key]}); first kept"))
            continue
        seen_keys[key] = path
        label = class_index[cls] if cls in class_index else int(cls)
        items.append(Item(path, key, label))
    return items, classes, skipped


_COPY_FIRST = "copy the images to a local folder first (e.g. `aws s3 sync s3://BUCKET/PREFIX DIR`)"


def _class_names(src: Path, raw: list[str]) -> list[str]:
    """The class names as stored in the index (`gpufeed.text.valid_text`); a PackError when two
    names become one."""
    names = [valid_text(c) for c in raw]
    seen: dict[str, str] = {}
    for name, c in zip(names, raw, strict=True):
        if name in seen:
            first, second = (_as_bytes(x) for x in (seen[name], c))
            raise PackError(
                f"{visible(src)}: the class names {first!r} and {second!r} (as bytes) "
                f"would both be stored as {name!r}: rename one of them"
            )
        seen[name] = c
    return names


def _as_bytes(name: str) -> bytes:
    """The bytes of a name as the file system or list file gave them."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace")
