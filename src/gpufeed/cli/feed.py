"""The commands that make shards for the Loader: `pack` (images into tar shards) and `index`
(existing WebDataset shards), locally or on S3; each calls one function of `data/`."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufeed.cli.options import TIMEOUT_HELP, default, remote_options, warn_now
from gpufeed.data.packing import pack


def pack_cmd(
    src: Annotated[
        str,
        typer.Argument(
            help="Image folder (SRC/<class>/<image>) or list file (PATH LABEL per line; tab, comma or spaces between, the label last)."
        ),
    ],
    dst: Annotated[str, typer.Argument(help="Output directory or s3://bucket/prefix.")],
    shard_size: Annotated[
        str,
        typer.Option("--shard-size", help="Target bytes per shard (1-128 MB is the useful range)."),
    ] = default(pack, "shard_size"),
    resize: Annotated[
        int | None,
        typer.Option(
            "--resize", help="Pre-resize to this short side (and re-encode at --quality)."
        ),
    ] = default(pack, "resize"),
    quality: Annotated[
        int, typer.Option("--quality", help="JPEG quality for re-encoded images.")
    ] = default(pack, "quality"),
    workers: Annotated[
        int | None, typer.Option("--workers", help="Worker processes (default: the usable cores).")
    ] = default(pack, "workers"),
    verify: Annotated[
        bool, typer.Option("--verify", help="Decode every image; skip the ones that fail.")
    ] = default(pack, "verify"),
    seed: Annotated[
        int, typer.Option("--seed", help="Seed for the sample order across shards.")
    ] = default(pack, "seed"),
    timeout: Annotated[float | None, typer.Option("--timeout", help=TIMEOUT_HELP)] = None,
) -> None:
    """Pack images into tar shards (WebDataset layout) plus gpufeed-index.json, locally or on S3."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("default")  # each distinct warning once per process, not per image
        warnings.showwarning = warn_now
        result = pack(
            src, dst, shard_size=shard_size, resize=resize, quality=quality,
            workers=workers, verify=verify, seed=seed, storage_options=remote_options(timeout),
        )  # fmt: skip
    typer.echo(result.summary())


def index_cmd(
    shards: Annotated[
        list[str],
        typer.Argument(
            help="WebDataset shards: paths, s3:// URLs, brace patterns (x-{000..099}.tar)"
        ),
    ],
    classes: Annotated[
        str | None,
        typer.Option(
            "--classes",
            help="class names by id: a text file (one a line), a JSON list or {name: id}",
        ),
    ] = None,
    label_field: Annotated[
        str | None,
        typer.Option(
            "--label-field", help="the .json field holding the label (default: cls, label, class)"
        ),
    ] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help=TIMEOUT_HELP)] = None,
) -> None:
    """Index existing WebDataset tar shards in one pass, so `Loader` reads them (writes gpufeed-index.json next to them)."""
    from gpufeed.data.indexer import index_shards

    result = index_shards(
        shards, classes=classes, label_field=label_field, storage_options=remote_options(timeout)
    )
    typer.echo(result.summary())
