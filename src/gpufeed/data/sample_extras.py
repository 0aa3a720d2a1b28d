"""`extras=`: each sample's key and members beside the images, for a Loader that needs more than
(images, labels): an evaluation that writes predictions per file, a label or box kept in `.json`.

`Loader(..., extras=("__key__", "json"))` yields `(images, labels, keys, jsons)`: one list per
name, in the order given, aligned with the batch (corrupt samples left out of the images are
left out here too). Names, as WebDataset's `to_tuple` takes them: "__key__" (the sample's key),
"__url__" (its shard's path or URL), or a member's extension: "json", "txt" or "cls". Decoded as
WebDataset's `decode()` does: json → the parsed object, txt → str, cls → int (its text if it is
a class name); `decode_extras=False` gives the members' bytes. A sample without a member asked
for is a `MissingMember` error naming the shard, key and member, as WebDataset's `to_tuple`
does; nothing is made up for it.

Workers read the members with the image (`members.read_with_members` for indexed shards) and send
each batch's values with its metadata (`rows`); the device stage drops the rows of the samples it
left out as corrupt and hands the columns on (`columns`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpufeed.data.shards import META_EXTS, ShardError
from gpufeed.errors import OptionError
from gpufeed.text import visible

if TYPE_CHECKING:
    from gpufeed.data.dataset import RawSample
    from gpufeed.data.slot_meta import SlotMeta

SPECIAL = ("__key__", "__url__")  # not members: the sample's key, its shard
NAMES = (*SPECIAL, *sorted(META_EXTS))


class MissingMember(ShardError):
    """A sample lacks a member that `extras=` asks for (or it cannot be decoded); the message
    names the shard, key and member."""


def extras_option(value: Any) -> tuple[str, ...]:
    """`extras=` as a tuple of names (one name may be given alone); an OptionError for names
    other than `NAMES`, or one given twice."""
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        names = (value,)
    for name in names:
        if not isinstance(name, str) or name.lower().lstrip(".") not in NAMES:
            raise OptionError(
                f"extras={value!r}: {name!r} is not a name it takes; give a tuple of "
                f"{', '.join(repr(n) for n in NAMES)} (e.g. extras=('__key__', 'json'))"
            )
    names = tuple(n.lower().lstrip(".") for n in names)
    twice = [n for n, c in Counter(names).items() if c > 1]
    if twice:
        raise OptionError(f"extras={value!r}: {twice[0]!r} is given twice; give it once")
    return names


def members_wanted(names: Sequence[str]) -> bool:
    """Whether `names` asks for members (so samples are read whole, not only their images)."""
    return any(n not in SPECIAL for n in names)


def sample_values(
    names: Sequence[str], decode: bool, shard: str, key: str, parts: dict[str, bytes]
) -> tuple[Any, ...]:
    """One sample's values of `names`, from its members `parts` ({extension: bytes})."""
    out: list[Any] = []
    for name in names:
        if name == "__key__":
            out.append(key)
        elif name == "__url__":
            out.append(shard)
        elif name not in parts:
            have = ", ".join(f".{e}" for e in sorted(parts)) or "none"
            raise MissingMember(
                f"shard {visible(shard)}, key {visible(key)}: the sample has no .{name} member, "
                f"which extras= asks for (its other members: {have}); leave {name!r} out of "
                "extras, or add the member to every sample and index the shards again "
                "(`gpufeed index`)"
            )
        else:
            out.append(_decoded(name, parts[name], shard, key) if decode else parts[name])
    return tuple(out)


def _decoded(ext: str, data: bytes, shard: str, key: str) -> Any:
    """A member's bytes as WebDataset's default decoders make them."""
    try:
        text = data.decode("utf-8")
        if ext == "json":
            return json.loads(text)
        if ext == "cls":
            text = text.strip()
            try:
                return int(text)
            except ValueError:
                return text  # a class name
        return text
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise MissingMember(
            f"shard {visible(shard)}, key {visible(key)}: its .{ext} member cannot be decoded "
            f"({e}); fix the member, or pass decode_extras=False to get its bytes"
        ) from None


def rows(samples: Sequence[RawSample]) -> list[tuple[str, str, tuple[Any, ...]]]:
    """What a worker sends with a batch: (shard, key, values) of each sample, in batch order."""
    return [(s.shard, s.key, s.extras or ()) for s in samples]


def columns(meta: SlotMeta, corrupt: Sequence[tuple[str, str, str]]) -> tuple[list, ...]:
    """The batch's extras as one list per name, without the samples left out as corrupt (named
    by shard and key in `corrupt`); () when the batch carries none."""
    made = meta.extras
    if not made:
        return ()
    width = len(made[0][2])
    if corrupt:
        left_out = Counter((shard, key) for shard, key, _ in corrupt)
        kept = []
        for shard, key, values in made:
            if left_out[shard, key] > 0:
                left_out[shard, key] -= 1
            else:
                kept.append((shard, key, values))
        made = kept
    return tuple([values[j] for _, _, values in made] for j in range(width))
