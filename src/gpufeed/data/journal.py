"""The pack journal: what makes an interrupted `gpufeed pack` resumable. One small record per
finished shard (`.pack-state.NNNNN.json`; older versions rewrote one `.pack-state.json` whole
after every shard, which is still read), each with the inputs consumed so far and what was
converted or skipped; a record of a pack of other inputs or options is a PackError."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpufeed.data.destination import Destination
from gpufeed.data.index_file import ShardEntry
from gpufeed.data.pack_errors import OtherPackError, PackError
from gpufeed.data.tar_scan import ShardError

STATE_NAME = ".pack-state.json"  # the journal of older versions (`.done`: a finished pack's mark)


SHARD_FILE = r"shard-\d{5,}\.tar"  # the names `shard_name` gives


# the files a pack writes in DST (shards, index, journal records, the skipped list)
PACK_FILES = re.compile(
    rf"{SHARD_FILE}|gpufeed-index\.json|\.pack-state(?:\.\d{{5,}})?\.json(?:\.done)?"
    r"|pack-skipped\.txt"
)


@dataclass
class Journal:
    """What an interrupted pack of the same inputs finished: its shards, how many inputs they
    consumed, and what was converted or skipped on the way (listing's skips aside)."""

    entries: list[ShardEntry] = field(default_factory=list)
    consumed: int = 0
    converted: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def add(self, record: dict[str, Any], shards: Any) -> bool:
        """Take in a journal file's `shards` and what it says was consumed, converted and
        skipped; False, taking nothing, when it is malformed."""
        try:
            entries = [ShardEntry.from_json(e) for e in shards]
            consumed = int(record["consumed"])
            converted = [(str(p), str(why)) for p, why in record.get("converted", [])]
            skipped = [(str(p), str(why)) for p, why in record.get("skipped", [])]
        except (ValueError, KeyError, TypeError):
            return False
        self.entries += entries
        self.consumed = consumed
        self.converted += converted
        self.skipped += skipped
        return True


def refuse_foreign_shards(out: Destination) -> None:
    """An OtherPackError when DST holds shard files that no pack journal or index owns (another
    tool's `shard-%05d.tar`, a pack whose index was deleted): packing would write over them,
    and a later `gpufeed index` would mix the rest in."""
    try:
        names = sorted(n for n in out.sizes() if re.fullmatch(SHARD_FILE, n))
    except (FileNotFoundError, ShardError):  # no DST yet
        return
    if names:
        more = f" (and {len(names) - 1} more shard files)" if len(names) > 1 else ""
        raise OtherPackError(
            f"{out.path(names[0])}{more} already exists, and no gpufeed index or pack journal "
            "in DST owns it: packing would write over it; use an empty DST, or move the "
            "shards away first"
        )


def record_name(number: int) -> str:
    """The journal record of finished shard `number`: a small file per shard, so what the
    journal writes grows with the data set (rewriting one file after every shard, as older
    versions did, grew with its square: ~100 GB for ImageNet)."""
    return f".pack-state.{number:05d}.json"


def load_journal(out: Destination, sigs: tuple[str, ...]) -> Journal | None:
    """The journal of an interrupted pack in DST: an older version's `.pack-state.json`, then
    the records of the shards after it, as far as they are whole; None when there is none."""
    legacy = _load_legacy(out, sigs)
    journal = legacy or Journal()
    if not out.exists(record_name(len(journal.entries))):  # one request where there is none
        return legacy
    names = out.sizes()
    while (name := record_name(len(journal.entries))) in names:
        record = _read_journal(out, name, sigs)
        if record is None or not journal.add(record, [record.get("shard")]):
            break  # unreadable: this shard and the ones after it are packed again
    return journal if legacy or journal.entries else None


def _load_legacy(out: Destination, sigs: tuple[str, ...]) -> Journal | None:
    """The journal an older version left (one file with every finished shard), or None."""
    state = _read_journal(out, STATE_NAME, sigs) if out.exists(STATE_NAME) else None
    if state is None:
        return None
    journal = Journal()
    return journal if journal.add(state, state.get("shards")) else None


def _read_journal(out: Destination, name: str, sigs: tuple[str, ...]) -> dict[str, Any] | None:
    """Journal file `name` as a dict; None when it is not JSON; a PackError when it is from a
    pack of other inputs or options."""
    try:
        state = json.loads(out.read_bytes(name))
    except ValueError:
        return None
    if not isinstance(state, dict):
        return None
    if state.get("signature") not in sigs:
        raise PackError(
            f"{out.path(name)}: an unfinished pack from different inputs or options is in "
            "this destination; use a new DST or delete that pack there first"
        )
    return state


def save_record(
    out: Destination,
    sig: str,
    number: int,
    entry: ShardEntry,
    consumed: int,
    converted: list[tuple[str, str]],
    skipped: list[tuple[str, str]],
) -> None:
    """Record finished shard `number`: it, the inputs consumed so far, and what was converted
    or skipped since the shard before."""
    record = {
        "signature": sig,
        "consumed": consumed,
        "shard": entry.to_json(),
        "converted": converted,
        "skipped": skipped,
    }
    out.write_bytes(record_name(number), json.dumps(record).encode())


def drop_journal(out: Destination, shards: int) -> None:
    """Remove the journal of a finished pack of `shards` shards."""
    out.remove(STATE_NAME)
    for number in range(shards):
        out.remove(record_name(number))
