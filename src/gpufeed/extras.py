"""Optional dependencies: each feature that needs one imports it through `require`, so a missing
one is a one-line error naming the pip extra to install instead of a bare ImportError."""

from __future__ import annotations

import importlib
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


class MissingExtra(GpufeedError, ImportError):
    """A feature's optional dependency is not installed; the message names the extra."""


def require(extra: str) -> ModuleType:
    """The module of `extra` (see EXTRAS), or MissingExtra saying what to install."""
    module, feature = EXTRAS[extra]
    try:
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
