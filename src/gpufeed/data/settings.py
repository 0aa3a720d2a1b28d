"""Loader settings written by `gpufeed tune`, read back as `Loader` keyword arguments.

from gpufeed.data import Loader, load_settings
loader = Loader("shards/", **load_settings("gpufeed-tune.json"))
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpufeed.data.choose import PREPROCESS_MODES
from gpufeed.data.spec import DECODERS
from gpufeed.errors import GpufeedError

__all__ = ["SETTING_KEYS", "SettingsError", "load_settings"]

SETTING_KEYS = ("batch_size", "num_workers", "prefetch", "preprocess", "decoder")
OPTIONAL = {"decoder": "auto"}  # keys a file may lack (written before they existed): their default


class SettingsError(GpufeedError, ValueError):
    """A settings file that cannot be used; the message names the file and the key."""


def load_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The winning Loader keyword arguments from a `gpufeed tune` file: `Loader(data, **them)`."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise SettingsError(f"{p}: no such settings file; write one with `gpufeed tune`") from None
    except (OSError, ValueError) as e:
        raise SettingsError(
            f"{p}: not a readable JSON settings file ({e}); run `gpufeed tune` again"
        ) from None
    loader = doc.get("loader") if isinstance(doc, dict) else None
    if not isinstance(loader, dict):
        raise SettingsError(
            f"{p}: no 'loader' object; this is not a file written by `gpufeed tune`"
        )
    loader = {**OPTIONAL, **loader}
    missing = [k for k in SETTING_KEYS if k not in loader]
    unknown = sorted(set(loader) - set(SETTING_KEYS))
    if missing or unknown:
        raise SettingsError(
            f"{p}: 'loader' has "
            + (f"missing keys {missing}" if missing else f"unknown keys {unknown}")
            + f"; expected exactly {list(SETTING_KEYS)}"
        )
    for key in ("batch_size", "num_workers", "prefetch"):
        if not isinstance(loader[key], int) or loader[key] < (1 if key != "num_workers" else 0):
            raise SettingsError(f"{p}: loader.{key} = {loader[key]!r} is not a valid count")
    if loader["preprocess"] not in PREPROCESS_MODES:
        raise SettingsError(
            f"{p}: loader.preprocess = {loader['preprocess']!r}: use one of "
            + ", ".join(PREPROCESS_MODES)
        )
    if loader["decoder"] not in DECODERS:
        raise SettingsError(
            f"{p}: loader.decoder = {loader['decoder']!r}: use one of " + ", ".join(DECODERS)
        )
    return {k: loader[k] for k in SETTING_KEYS} | {"num_workers": _workers_here(p, doc, loader)}


def _workers_here(p: Path, doc: dict[str, Any], loader: dict[str, Any]) -> int:
    """The file's num_workers, or this machine's default where the file was tuned for more
    cores per training process than this one has (another machine, or more local ranks), with
    a warning: 15 workers tuned on 16 cores, under torchrun with 8 ranks, would be 120. A file
    that does not say (written before tune recorded it) is only held to this one's cores."""
    import warnings

    from gpufeed.cores import cores_per_rank
    from gpufeed.data.loader import default_workers

    n, there, here = loader["num_workers"], doc.get("cores_per_rank"), cores_per_rank()
    if n <= default_workers() or there == here:
        return n
    if there is None and n <= here:  # a file from before tune said: no more workers than cores
        return n
    why = (
        f"was tuned for {there} cores per training process; this one has {here}"
        if there
        else f"is more than the {here} cores this training process has"
    )
    warnings.warn(
        f"{p}: num_workers={n} {why}: using num_workers={default_workers()}. Run "
        "`gpufeed tune` here for settings of its own",
        RuntimeWarning,
        stacklevel=3,
    )
    return default_workers()
