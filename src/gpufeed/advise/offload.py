"""When does moving decode and augmentation to a Ray cluster's CPU nodes help, and how many cores?

Rule of thumb: the CPU becomes the bottleneck when the ratio of preprocessing load to model
compute (CPU seconds per image / GPU seconds per image = cores needed to keep the GPU busy)
exceeds the ratio of CPU to GPU capacity (the cores this host can give the loader). The cores
missing are what remote CPU nodes should add (`Loader(cluster=...)`), and the uint8 batches
they send back need `images/s × H×W×3` bytes/s of network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufeed.advise.measure import WAITING
from gpufeed.text import count

HEADROOM = 1.2  # remote cores are sized 20% above the bare need: node jitter, network stalls
# the README section on Loader(cluster=...), named as its heading reads
README_SECTION = 'README "Outgrow one machine: preprocess on a Ray cluster\'s CPU nodes"'


@dataclass(frozen=True)
class OffloadAdvice:
    """The comparison behind the advice and what offloading would take."""

    cpu_s_per_image: float  # preprocessing CPU seconds per image, on one core
    model_images_per_s: float  # what the model alone consumes
    host_cores: int  # cores this host can give preprocessing (the training loop keeps one)
    image_bytes: int  # bytes of one uint8 image sent back (H×W×3)
    data_wait_share: float = math.nan  # training's, end to end (NaN: not measured)

    @property
    def waiting(self) -> bool:
        """False where training, measured end to end, hardly waits for data: nothing to gain."""
        return not self.data_wait_share < WAITING

    @property
    def cores_needed(self) -> float:
        """Cores of preprocessing that keep the model busy."""
        return self.cpu_s_per_image * self.model_images_per_s

    @property
    def helps(self) -> bool:
        """True when the host's cores cannot keep up with the model, and training waits."""
        return self.waiting and self.cores_needed > self.host_cores

    @property
    def remote_cores(self) -> int:
        """CPU cores the Ray cluster needs (0 when the host suffices): all of the preprocessing,
        with headroom, since Loader(cluster=...) runs all of it there (the README's head gives
        the GPU host's cores none)."""
        if not self.helps:
            return 0
        return max(1, math.ceil(self.cores_needed * HEADROOM))

    @property
    def network_bytes_per_s(self) -> float:
        """Bytes/s of uint8 batches the cluster sends at the model's pace (every image)."""
        return self.model_images_per_s * self.image_bytes if self.helps else 0.0

    def text(self) -> str:
        """One line of advice for diagnose/tune output."""
        need = (
            f"preprocessing needs {self.cores_needed:.1f} cores to keep up with the model "
            f"({self.cpu_s_per_image * 1e3:.1f} ms CPU/image × {self.model_images_per_s:,.0f} "
            f"images/s); this host gives the loader {count(self.host_cores, 'core')}"
        )
        if not self.waiting:
            return (
                f"offload to CPU nodes: not needed, training waits for data only "
                f"{self.data_wait_share:.0%} of the time; {need}"
            )
        if not self.helps:
            return f"offload to CPU nodes: not needed, {need}"
        gbit = self.network_bytes_per_s * 8 / 1e9
        return (
            f"offload to CPU nodes: would help, {need}; give Loader(cluster=...) a Ray cluster "
            f"of ~{self.remote_cores} CPU cores (it preprocesses everything there, "
            f"{README_SECTION}) and ~{gbit:.1f} Gbit/s into this host"
        )


def offload_advice(
    loader_images_per_s: float,
    loader_cores: int,
    model_images_per_s: float,
    host_cores: int,
    image_size: tuple[int, int] = (224, 224),
    cpu_s_per_image: float = math.nan,
    data_wait_share: float = math.nan,
) -> OffloadAdvice:
    """Advice from a loader measured alone with `loader_cores` workers (0: the training process
    loads) and the model alone. An image costs the CPU time measured meanwhile
    (`cpu_s_per_image`: workers that wait on storage or sleep cost little), and at most what
    the loader's cores could spend: alone, it keeps at most every core busy, the training
    process's one too (`host_cores` + 1), however many workers it has. `data_wait_share`:
    training's end to end; below `WAITING` remote cores are not advised, whatever the sizes say."""
    if loader_images_per_s <= 0 or model_images_per_s <= 0:
        raise ValueError("offload advice needs positive loader and model rates (images/s)")
    h, w = image_size
    busy = min(max(1, loader_cores), max(1, host_cores) + 1)
    most = busy / loader_images_per_s
    return OffloadAdvice(
        cpu_s_per_image=min(most, cpu_s_per_image) if cpu_s_per_image >= 0 else most,
        model_images_per_s=model_images_per_s,
        host_cores=max(1, host_cores),
        image_bytes=h * w * 3,
        data_wait_share=data_wait_share,
    )
