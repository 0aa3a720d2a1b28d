"""The errors of `gpufeed pack`, apart so that listing, the journal and the pack itself raise the
same ones (each is a `GpufeedError`: its message says what was wrong and what to do)."""

from __future__ import annotations

from gpufeed.errors import GpufeedError


class PackError(GpufeedError, ValueError):
    """Bad pack input or options; the message says which and what to do."""


class OtherPackError(PackError):
    """DST holds a pack of other inputs or options (`repack_cache` replaces it)."""


class NothingPacked(PackError):
    """Every input was skipped; `skipped` lists them (path, why)."""

    def __init__(self, message: str, skipped: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.skipped = skipped
