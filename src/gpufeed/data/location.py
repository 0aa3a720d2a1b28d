"""Where a data set lives, from its URL alone: a local folder or a remote URL that fsspec opens
(`s3://bucket/prefix`), with a clear error for a remote URL mistyped into a local path."""

from __future__ import annotations

import os
import re

from gpufeed.data.shards import ShardError


def is_remote(url: str) -> bool:
    """True for URLs fsspec should open (s3://, gs://, ...), false for local paths."""
    return "://" in str(url) and not str(url).startswith("file://")


# `s3:/bucket/x`, `s3:bucket/x`: a remote scheme without its `//`, which would name a local folder
_MISTYPED_URL = re.compile(r"(s3a?|gs|gcs|az|abfss?|https?):/?(?!/)[^/]*", re.IGNORECASE)


def base_url(url: str | os.PathLike[str]) -> str:
    """`url` without trailing slashes (and `~` expanded); a ShardError for a remote URL that
    names no bucket (`s3://`, `s3:///prefix`), which would otherwise be taken for a local folder
    `s3:`."""
    text = str(url)
    if not is_remote(text):
        typo = _MISTYPED_URL.match(text)
        if typo and not os.path.exists(typo[0].rstrip("/")):
            scheme, rest = text.split(":", 1)
            raise ShardError(
                f"{text} looks like a mistyped URL (one slash or none after '{scheme}:'): write "
                f"{scheme.lower()}://{rest.lstrip('/')}, or ./{text} for a local folder"
            )
        return os.path.expanduser(text).rstrip("/")
    scheme, rest = text.split("://", 1)
    rest = rest.rstrip("/")
    if not rest.split("/", 1)[0]:
        raise ShardError(
            f"{text} names no bucket: give {scheme}://BUCKET or {scheme}://BUCKET/PREFIX"
        )
    return f"{scheme}://{rest}"
