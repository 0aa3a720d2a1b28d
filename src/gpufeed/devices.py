"""The default device: one place decides where work runs when the user names no device."""

from __future__ import annotations


def default_device() -> str:
    """ "cuda" where PyTorch sees a CUDA GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
