"""MODEL: ResNets (resnet), a training loop with AMP and channels_last (loop) and DDP set-up
from torchrun's environment (distributed).

``from gpufeed.train import resnet, fit, SyntheticData, setup_distributed`` (imports torch).
"""

from __future__ import annotations

from gpufeed.train.distributed import DistInfo, cleanup_distributed, setup_distributed
from gpufeed.train.loop import FitResult, SyntheticData, fit
from gpufeed.train.resnet import MODELS, resnet

__all__ = [
    "MODELS",
    "DistInfo",
    "FitResult",
    "SyntheticData",
    "cleanup_distributed",
    "fit",
    "resnet",
    "setup_distributed",
]
