"""The one reader of tar shards: `gpufeed index` (`indexer`), the Loader's reads at index offsets
(`shards.read_indexed`, `members.read_with_members`) and its member-by-member reads
(`shards.iter_samples`) all walk a shard's headers here, so what `index` accepts the Loader reads.

The rules, applied to every header read:
- members are regular files (type '0', NUL or '7'); directory entries are skipped; links, devices,
  FIFOs, GNU sparse files and every other type are refused by name, as are member names that
  escape a directory and types that could hold pickled objects (`FORBIDDEN_EXTS`);
- extension headers are read: pax ('x': `path` and `size` records; GNU sparse records are
  refused), pax global headers ('g') that change no member (as `git archive` writes), GNU long
  names ('L');
- every size a header claims (its size field, a pax `size` record) is checked against the bytes
  the shard holds before anything is read on; base-256 sizes (GNU's encoding for members of
  8 GiB and more: no image is that large) are refused;
- zero blocks between members are skipped, as `tar --ignore-zeros` does, so tars joined end to end
  (`cat a.tar b.tar`) are read whole (webdataset and plain `tar -x` stop at the first archive's
  end and drop the rest silently); a shard must end in zeros after its last member (tar's
  end-of-archive marker), so a shard cut at a member boundary is found;
- members sharing a key make one sample, as in WebDataset (`samples`); a member repeated in a
  sample, or a key that comes back after other samples, is refused: either would quietly merge or
  drop images.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Container, Iterable, Iterator
from pathlib import PurePosixPath
from typing import NamedTuple

from gpufeed.errors import GpufeedError

BLOCK = 512
ZEROS = bytes(BLOCK)
# Members that could carry pickled Python objects: a shard holding one is rejected outright.
FORBIDDEN_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt", "joblib", "npy", "npz"})
MAX_EXTENSION = 1 << 20  # bytes of one extension header (a long name, pax records) read at most
_ENCODING = sys.getfilesystemencoding()  # how tarfile decodes header names (tarfile.ENCODING)
_REGULAR = frozenset(b"0\x007")
_DIRECTORY, _PAX, _GLOBAL, _LONG_NAME, _LONG_LINK = b"5xgLK"
_REFUSED = {
    ord("1"): "a link (hard)",
    ord("2"): "a link (symbolic)",
    ord("3"): "a character device",
    ord("4"): "a block device",
    ord("6"): "a FIFO",
    ord("S"): "a GNU sparse file",
    ord("V"): "a GNU volume header",
    ord("M"): "a GNU multi-volume continuation",
    ord("D"): "a GNU incremental dump directory",
    ord("N"): "an old GNU long-name record",
}
# pax records that change what a member is, as gpufeed reads it
_MEMBER_RECORDS = (b"path", b"size")


class ShardError(GpufeedError):
    """A shard or index is missing, truncated or malformed; the message names it."""


class BadHeader(ShardError):
    """No valid tar header where one should start; `at` and `reason` let a caller that knows
    why a header was expected there (an index offset) say so."""

    at: int = 0
    reason: str = ""


class Member(NamedTuple):
    """One member: where its headers start (extension headers included), where its data starts,
    its name and size. A directory entry has `folder` set (and `data` is where the next starts)."""

    start: int
    data: int
    name: str
    size: int
    folder: bool = False


def padded(n: int) -> int:
    """`n` rounded up to whole tar blocks."""
    return (n + BLOCK - 1) // BLOCK * BLOCK


def truncated(shard: str, at: int, inside: str | None) -> ShardError:
    """A shard that ends at byte `at` before tar's end-of-archive marker (`inside`: the part)."""
    where = f"inside {inside}" if inside else "after a member, without tar's end-of-archive marker"
    return ShardError(
        f"shard {shard} is truncated at byte {at}: it ends {where} (a copy or write cut short?); "
        "re-write it"
    )


def bad_header(shard: str, at: int, reason: str) -> BadHeader:
    e = BadHeader(
        f"shard {shard}: no valid tar header at byte {at}, where the next member should start "
        f"(invalid header: {reason}); the shard is corrupt: re-write it"
    )
    e.at, e.reason = at, reason
    return e


class Tape:
    """A shard's bytes from offset `start` on: `buf`, and for a stream `read` to fetch more
    (`chunk` bytes or more at a time, bytes skipped read through, not kept). `end` is where the
    shard's bytes end: every size a header claims is checked against it before it is read. A
    buffer without `read` asked for bytes past its end is a ShardError saying a member runs past
    `past` (what lies there: the index's next sample, say)."""

    __slots__ = ("buf", "chunk", "end", "past", "read", "shard", "start")

    def __init__(
        self,
        shard: str,
        buf: bytes,
        start: int,
        end: int,
        *,
        read: Callable[[int], bytes] | None = None,
        chunk: int = 1 << 16,
        past: str = "where the index puts the next sample (or the shard's end)",
    ) -> None:
        self.shard, self.buf, self.start, self.end = shard, buf, start, end
        self.read, self.chunk, self.past = read, chunk, past

    def take(self, at: int, n: int) -> bytes:
        """The `n` bytes from shard offset `at` (never before the last `take`'s offset)."""
        i = at - self.start
        if i + n <= len(self.buf):
            return self.buf[i : i + n]
        return self._more(at, n)

    def overrun(self, at: int) -> ShardError:
        """A member that runs past byte `at`, where the bytes it may take end."""
        return ShardError(
            f"shard {self.shard}: a member runs past {self.past} (byte {at}); the shard is "
            "corrupt or the index does not belong to it"
        )

    def _more(self, at: int, n: int) -> bytes:
        if self.read is None:
            raise self.overrun(self.start + len(self.buf))
        pos = self.start + len(self.buf)  # how far the stream has been read
        kept = self.buf[at - self.start :] if at < pos else b""
        while pos < at:  # data not kept: read through
            got = self.read(min(at - pos, self.chunk))
            if not got:
                raise self._short(pos)
            pos += len(got)
        parts, have = [kept], len(kept)
        while have < n:
            got = self.read(max(n - have, self.chunk))
            if not got:
                raise self._short(at + have)
            parts.append(got)
            have += len(got)
        self.buf, self.start = b"".join(parts), at
        return self.buf[:n]

    def _short(self, at: int) -> ShardError:
        return ShardError(
            f"shard {self.shard} ended at byte {at} while it was read, before the {self.end} "
            "bytes it had when opened: was it changed meanwhile? Read it again once written"
        )

    def zeros(self, at: int, stop: int) -> int:
        """The offset of the first block from `at` on that is not all zeros, or `stop`."""
        while at < stop:
            i = at - self.start
            if i >= len(self.buf):
                self._more(at, min(BLOCK, stop - at))
                i = 0
            seg = self.buf[i : i + stop - at]
            lead = len(seg) - len(seg.lstrip(b"\0"))
            if lead < len(seg):
                return at + lead // BLOCK * BLOCK
            at += len(seg)
        return stop


def header(block: bytes, at: int, shard: str) -> tuple[int, str, int]:
    """(type, name, size) of the header `block` at shard byte `at`; a BadHeader unless its
    checksum holds and its size is an octal number, a ShardError for a base-256 size."""
    field = block[148:156].split(b"\0", 1)[0].strip()
    if not field or field.translate(None, b"01234567"):
        raise bad_header(shard, at, "its checksum field is not an octal number")
    chksum = int(field, 8)
    if chksum != 256 + sum(block) - sum(block[148:156]) and chksum != 256 + sum(
        struct.unpack_from("148b8x356b", block)  # the signed sum some old tars wrote
    ):
        raise bad_header(shard, at, "its checksum does not match")
    name = block[:100].split(b"\0", 1)[0].decode(_ENCODING, "surrogateescape")
    if block[124] & 0x80:  # base-256: 0x80 positive, 0xff negative
        claim = (
            int.from_bytes(block[125:136], "big")
            if block[124] == 0x80
            else int.from_bytes(block[124:136], "big", signed=True)
        )
        raise ShardError(
            f"shard {shard}: member {name!r} at byte {at} claims {claim:,} bytes in base-256 (the "
            "GNU encoding for members of 8 GiB and more); gpufeed reads no member that large: "
            "the shard is corrupt or holds something else; re-write it"
        )
    field = block[124:136].split(b"\0", 1)[0].strip()
    if field.translate(None, b"01234567"):
        raise bad_header(shard, at, "its size field is not an octal number")
    return block[156], name, int(field or b"0", 8)


def _pax(data: bytes, at: int, shard: str) -> dict[bytes, bytes]:
    """The records of the pax header at `at` ("LENGTH KEY=VALUE\\n" each)."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos]:  # tarfile ignores NUL padding after the records
        space = data.find(b" ", pos, pos + 20)
        length = int(data[pos:space]) if space > pos and data[pos:space].isdigit() else 0
        record = data[pos : pos + length]
        if length <= space - pos or not record.endswith(b"\n") or b"=" not in record:
            raise bad_header(shard, at, f"malformed pax record at its byte {pos}")
        key, _, value = record[space - pos + 1 : -1].partition(b"=")
        records[key] = value
        pos += length
    return records


def member(tape: Tape, at: int) -> Member | None:
    """The member whose headers start at `at`, checked by the rules above (its data is not read);
    None for a zero block."""
    start, name, size = at, None, None
    while True:
        block = tape.take(at, BLOCK)
        if block == ZEROS:
            if at != start:
                raise bad_header(tape.shard, at, "an extension header with no member after it")
            return None
        kind, own, own_size = header(block, at, tape.shard)
        if kind in _REGULAR or kind == _DIRECTORY:
            if name is None:
                name = own
                if block[345]:  # a ustar prefix: the name's leading folders
                    prefix = block[345:500].split(b"\0", 1)[0].decode(_ENCODING, "surrogateescape")
                    name = f"{prefix}/{name}"
            size = own_size if size is None else size
            if kind == _DIRECTORY or name.endswith("/"):
                _check_name(name.rstrip("/"), tape.shard)
                if size:
                    raise ShardError(
                        f"shard {tape.shard}: folder entry {name!r} at byte {at} claims {size:,} "
                        "bytes of data; rejected: re-write the shard"
                    )
                return Member(start, at + BLOCK, name, 0, True)
            _check_name(name, tape.shard)
            if _ext(name).rsplit(".", 1)[-1] in FORBIDDEN_EXTS:
                raise ShardError(
                    f"shard {tape.shard}: member {name!r} may hold pickled objects; gpufeed never "
                    "unpickles, so shards with such members are rejected"
                )
            if at + BLOCK + padded(size) > tape.end:
                raise _claims(tape, at, name, size)
            return Member(start, at + BLOCK, name, size)
        if kind not in (_PAX, _GLOBAL, _LONG_NAME, _LONG_LINK):
            shown = name or own
            what = _REFUSED.get(kind, f"of tar type {chr(kind)!r}")
            if kind in (ord("1"), ord("2")):
                raise ShardError(
                    f"shard {tape.shard}: member {shown!r} at byte {at} is {what}; links are "
                    "rejected"
                )
            raise ShardError(
                f"shard {tape.shard}: member {shown!r} at byte {at} is {what}, not a regular "
                "file; rejected: re-write the shard with regular files only"
            )
        if own_size > MAX_EXTENSION or at + BLOCK + padded(own_size) > tape.end:
            raise _claims(tape, at, own, own_size, extension=True)
        data = tape.take(at + BLOCK, own_size)
        if kind == _LONG_NAME:
            name = data.split(b"\0", 1)[0].decode(_ENCODING, "surrogateescape")
        elif kind in (_PAX, _GLOBAL):
            records = _pax(data, at, tape.shard)
            if any(k.startswith(b"GNU.sparse.") for k in records):
                shown = records.get(b"GNU.sparse.name") or records.get(b"path") or own.encode()
                raise ShardError(
                    f"shard {tape.shard}: member {shown.decode('utf-8', 'surrogateescape')!r} at "
                    f"byte {at} is a GNU sparse file (pax GNU.sparse records), not a regular "
                    "file; rejected: re-write the shard with regular files only"
                )
            if kind == _GLOBAL:
                if any(k in records for k in _MEMBER_RECORDS):
                    raise ShardError(
                        f"shard {tape.shard}: the pax global header at byte {at} sets the path "
                        "or size of every member after it; rejected: re-write the shard"
                    )
            else:
                if b"path" in records:
                    name = records[b"path"].decode("utf-8", "surrogateescape")
                if b"size" in records:
                    if not records[b"size"].isdigit():
                        raise bad_header(tape.shard, at, "its pax size is not a number")
                    size = int(records[b"size"])
        at += BLOCK + padded(own_size)


def _claims(tape: Tape, at: int, name: str, size: int, *, extension: bool = False) -> ShardError:
    what = f"the extension header of {name!r}" if extension else f"member {name!r}"
    left = max(tape.end - at - BLOCK, 0)
    if extension and size > MAX_EXTENSION and size <= left:
        return ShardError(
            f"shard {tape.shard}: {what} at byte {at} is {size:,} bytes, more than the "
            f"{MAX_EXTENSION:,} gpufeed reads of one; rejected: re-write the shard"
        )
    return ShardError(
        f"shard {tape.shard} is truncated at byte {tape.end}: it ends inside {what}, whose header "
        f"at byte {at} claims {size:,} bytes where {left:,} are left (a copy or write cut short, "
        "or a corrupt header?); re-write it"
    )


def members(
    tape: Tape, at: int, stop: int, *, end: bool, keep: Container[str] | None = None
) -> Iterator[tuple[Member, bytes | None]]:
    """(member, its data) for every member from `at` up to exactly `stop`, directory entries
    skipped; the data is read for those whose extension is in `keep` (all when None), else None.
    With `end`, `stop` is the shard's end: the last member must be followed by tar's
    end-of-archive marker (zeros)."""
    marker = False
    while at < stop:
        if stop - at < BLOCK:  # a partial block: only zeros after the marker may end a shard
            if end and marker and not tape.take(at, stop - at).strip(b"\0"):
                return
            raise truncated(tape.shard, stop, "a tar header") if end else tape.overrun(stop)
        found = member(tape, at)
        if found is None:
            at, marker = tape.zeros(at, stop), True
            continue
        marker = False
        nxt = found.data + padded(found.size)
        if found.folder:
            at = nxt
            continue
        if nxt > stop:  # (past the shard's end: `member` says so first)
            raise tape.overrun(stop)
        data = None
        if keep is None or _ext(found.name) in keep:
            data = tape.take(found.data, found.size)
        yield found, data
        at = nxt
    if end and not marker:
        raise truncated(tape.shard, stop, None)


def walk_to(tape: Tape, at: int, image: int) -> Member:
    """Check every member from `at` on up to the one whose data starts at `image` (the image the
    index puts there) and return that one; `tape` holds the bytes up to `image`."""
    last = image - BLOCK  # where the image's own header starts
    while True:
        found = member(tape, at)
        if found is None:  # zeros: between tars joined end to end
            at = tape.zeros(at, last + 1)
            if at > last:
                raise bad_header(tape.shard, last, "zeros in front of the image")
            continue
        if found.data == image and not found.folder:
            return found
        at = found.data + padded(found.size)
        if at > last:
            raise tape.overrun(last)


def samples(
    found: Iterable[tuple[Member, bytes | None]], shard: str
) -> Iterator[tuple[str, int, dict[str, tuple[Member, bytes | None]]]]:
    """(key, offset of its first header, {extension: (member, data)}) for each run of members
    sharing a key (WebDataset's grouping: the key is the name up to the basename's first dot).
    A member repeated in a sample, or a key that comes back after other samples, is a
    ShardError: either would merge two samples' images into one or drop one silently."""
    key: str | None = None
    start, parts = 0, {}
    done: dict[str, int] = {}
    for m, data in found:
        k, ext = split_name(m.name)
        if k != key:
            if key is not None:
                yield key, start, parts
                done[key] = start
            if k in done:
                raise ShardError(
                    f"shard {shard}: key {k!r} at byte {m.start} names a sample already read (at "
                    f"byte {done[k]}), with other samples between: two samples with one key; "
                    "give every sample its own key and re-write the shard"
                )
            key, start, parts = k, m.start, {}
        elif ext in parts:
            raise ShardError(
                f"shard {shard}: sample {k!r} has member {m.name!r} twice (at bytes "
                f"{parts[ext][0].start} and {m.start}): a member repeated, or two samples with "
                "one key, would lose an image; give every sample its own key and re-write the "
                "shard"
            )
        parts[ext] = (m, data)
    if key is not None:
        yield key, start, parts


def split_name(name: str) -> tuple[str, str]:
    """WebDataset convention: the key is everything before the first dot of the basename."""
    if name.startswith("./") or "/." in name or "//" in name or name.endswith("/"):  # pathlib
        path = PurePosixPath(name)
        base, _, ext = path.name.partition(".")
        key = str(path.parent / base) if str(path.parent) != "." else base
        return key, ext.lower()
    folder, slash, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return folder + slash + stem, ext.lower()


def _ext(name: str) -> str:
    """`split_name(name)[1]`, without its key."""
    if "/." in name or "//" in name or name.endswith("/"):
        return split_name(name)[1]
    return name.rsplit("/", 1)[-1].partition(".")[2].lower()


def _check_name(name: str, shard: str) -> None:
    # pathlib's parts differ from a split on "/" only in dropping "" and "." components
    if (
        name.startswith(("/", "\\"))
        or ".." in name.split("/")
        or "\\" in name
        or ":" in name.split("/")[0]
    ):
        raise ShardError(f"shard {shard}: member name {name!r} escapes its directory; rejected")
    if not name:
        raise ShardError(f"shard {shard}: a member has an empty name; rejected")
