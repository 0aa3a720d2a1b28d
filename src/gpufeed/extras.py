"""Optional dependencies: each feature that needs one imports it through `require`, so a missing
one is a one-line error naming the pip extra to install instead of a bare ImportError."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

from gpufeed.errors import GpufeedError

# extra -> (module it provides, what it is for); pyproject.toml's optional-dependencies match
EXTRAS = {
    "s3": ("s3fs", "reading and writing s3:// data sets"),
    "bench": ("matplotlib", "charts of `gpufeed bench` experiments"),
    "gpu": ("torchvision", "JPEG decoding on the GPU (nvJPEG)"),
    "dali": ("nvidia.dali", "JPEG decoding with NVIDIA DALI (Loader(decoder='dali'))"),
    "nvimgcodec": (
        "nvidia.nvimgcodec",
        "JPEG decoding with NVIDIA nvImageCodec (Loader(decoder='nvimgcodec'))",
    ),
    "ray": (
        "ray",
        "Loader(cluster=...), preprocessing on a Ray cluster (install it on every node)",
    ),
    "tensorboard": ("tensorboard", "`gpufeed export --tensorboard`"),
    "huggingface": ("transformers", "gpufeed's Hugging Face TrainerCallback"),
    "lightning": ("pytorch_lightning", "gpufeed's PyTorch Lightning callback"),
}

# extra -> environment defaults while it is imported (a variable the user set wins). nvImageCodec
# logs, in colour on stderr and from every worker, each image it cannot decode; gpufeed reports
# those itself with the shard, the key and the reason.
QUIET_IMPORT = {"nvimgcodec": {"PYNVIMGCODEC_VERBOSITY": "0"}}


class MissingExtra(GpufeedError, ImportError):
    """A feature's optional dependency is not installed; the message names the extra."""


def require(extra: str) -> ModuleType:
    """The module of `extra` (see EXTRAS), or MissingExtra saying what to install."""
    module, feature = EXTRAS[extra]
    try:
        if module in sys.modules:
            return importlib.import_module(module)
        with _environment_defaults(QUIET_IMPORT.get(extra, {})):
            return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(
            f"{feature} needs {module.split('.')[0]}, which is not installed ({e}): "
            f"pip install 'gpufeed[{extra}]'"
        ) from None


def installed(extra: str) -> bool:
    """Whether the module of `extra` imports here."""
    try:
        require(extra)
    except MissingExtra:
        return False
    return True


@contextlib.contextmanager
def _environment_defaults(defaults: dict[str, str]) -> Iterator[None]:
    """Set the variables of `defaults` that are unset, for the block only (libraries that read
    their settings at import keep them; the user's environment and child processes do not)."""
    added = [name for name in defaults if name not in os.environ]
    os.environ.update({name: defaults[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)
