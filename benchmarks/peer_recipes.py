"""How each peer loader of `peer_loaders.py` is built and iterated: the peers' names and pip lines,
the shared per-image recipe (torchvision's RandomResizedCrop box, the Pillow op-for-op transform,
the folder listing) and one factory per loader, each the way its authors document it.

Kept apart from the driver so that `peer_loaders.py` holds only the run (data, rounds, measuring
the process tree, the table); the child process that measures a loader imports this module by
plain name, and worker processes unpickle the datasets and functions from it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BATCH = 32
SIZE = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
FFMPEG_APT = "apt-get install libavcodec59 libavformat59 libavutil57 libavdevice59 libavfilter8"


@dataclass(frozen=True)
class Peer:
    name: str  # the table's name
    module: str  # importable when the peer is installed
    pip: str  # how to install it
    dists: tuple[str, ...]  # distributions whose versions the results record


PEERS: dict[str, Peer] = {
    "gpufeed": Peer("gpufeed Loader", "gpufeed.data", "pip install gpufeed", ("gpufeed",)),
    "gpufeed-nice0": Peer(
        "gpufeed Loader, worker_nice=0", "gpufeed.data", "pip install gpufeed", ("gpufeed",)
    ),
    "dali": Peer(
        "DALI CPU pipeline",
        "nvidia.dali",
        "pip install nvidia-dali-cuda130",
        ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-nvimgcodec-cu13"),
    ),
    "spdl": Peer(
        "SPDL pipeline (FFmpeg)",
        "spdl.io",
        f"pip install spdl spdl-io (and FFmpeg's shared libraries: {FFMPEG_APT})",
        ("spdl", "spdl-io", "spdl-core"),
    ),
    "torchdata": Peer(
        "torchdata.nodes, threads", "torchdata.nodes", "pip install torchdata", ("torchdata",)
    ),
    "torchdata-proc": Peer(
        "torchdata.nodes, processes", "torchdata.nodes", "pip install torchdata", ("torchdata",)
    ),
    "dataloader": Peer("DataLoader + Pillow", "PIL", "pip install pillow", ("pillow",)),
    "webdataset": Peer(
        "WebDataset + Pillow", "webdataset", "pip install webdataset", ("webdataset",)
    ),
    "litdata": Peer("litdata + Pillow", "litdata", "pip install litdata", ("litdata",)),
}


def installed(key: str) -> bool:
    try:
        return importlib.util.find_spec(PEERS[key].module) is not None
    except (ImportError, ValueError):
        return False


# --------------------------------------------------------------------------- the shared recipe


def crop_box(h: int, w: int, rng: random.Random) -> tuple[int, int, int, int]:
    """(top, left, height, width): torchvision's RandomResizedCrop box (10 tries, then the
    central crop clamped to the ratio range)."""
    area = h * w
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        ratio = math.exp(rng.uniform(*log_ratio))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    in_ratio = w / h
    if in_ratio < RATIO[0]:
        cw, ch = w, round(w / RATIO[0])
    elif in_ratio > RATIO[1]:
        ch, cw = h, round(h * RATIO[1])
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def pillow_sample(img: Any, rng: random.Random) -> Any:
    """torchvision's PIL training recipe op for op: RandomResizedCrop(224) (crop, bilinear
    resize), RandomHorizontalFlip, ToTensor, Normalize; a 3×224×224 float32 tensor."""
    import numpy as np
    import torch
    from PIL import Image

    img = img.convert("RGB")
    top, left, h, w = crop_box(img.height, img.width, rng)
    img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img, np.uint8)).permute(2, 0, 1).to(torch.float32).div_(255)
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return x.sub_(mean).div_(std)


def list_folder(root: Path) -> list[tuple[str, int]]:
    """(path, label) of `root/<class>/<image>.jpg`, labels by sorted class folder."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [
        (str(f), label) for label, c in enumerate(classes) for f in sorted((root / c).glob("*.jpg"))
    ]


class PillowFolder:
    """A map-style dataset over (path, label) pairs: Pillow decode and `pillow_sample`."""

    def __init__(self, items: list[tuple[str, int]]) -> None:
        self.items = items
        self.pid, self.rng = os.getpid(), random.Random()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        if self.pid != os.getpid():  # a forked worker: its own crops, not a copy of the parent's
            self.pid, self.rng = os.getpid(), random.Random()
        path, label = self.items[i]
        with Image.open(path) as im:
            return pillow_sample(im, self.rng), label


# --------------------------------------------------------------------------- the loaders
# Each factory returns an iterable of one epoch of (images, labels) batches, re-iterable for the
# next epoch, and optionally a function that shuts it down.

Factory = Callable[[dict[str, Any]], tuple[Iterable[Any], Callable[[], None] | None]]


def make_gpufeed(cfg: dict[str, Any], **options: Any) -> tuple[Iterable[Any], Callable[[], None]]:
    from gpufeed.data import Augment, Loader

    loader = Loader(
        cfg["shards"],
        BATCH,
        num_workers=cfg["workers"],
        augment=Augment(size=SIZE, scale=SCALE, ratio=RATIO, hflip=0.5, mean=MEAN, std=STD),
        **options,
    )
    return loader, loader.close


def make_gpufeed_nice0(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None]]:
    """gpufeed's workers run at nice 5 by default (training's own process goes first); on a
    machine shared with other jobs that costs them CPU that the other loaders' workers get."""
    return make_gpufeed(cfg, worker_nice=0)


def make_dali(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=BATCH, num_threads=cfg["workers"], device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.file(
            file_root=str(cfg["folder"]), random_shuffle=True, name="Reader"
        )
        images = fn.decoders.image_random_crop(
            jpegs,
            device="cpu",
            output_type=types.RGB,
            random_area=list(SCALE),
            random_aspect_ratio=list(RATIO),
        )
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return images, labels

    p = pipe()
    p.build()
    it = DALIGenericIterator(
        p,
        ["images", "labels"],
        reader_name="Reader",
        last_batch_policy=LastBatchPolicy.PARTIAL,
        auto_reset=True,
    )

    class Epoch:
        def __iter__(self) -> Iterator[Any]:
            for out in it:
                yield out[0]["images"], out[0]["labels"].view(-1)

    return Epoch(), None


def make_spdl(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    import spdl.io
    import torch
    from spdl.pipeline import PipelineBuilder

    items = list_folder(cfg["folder"])
    rng = random.Random()
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)

    def source() -> Iterator[tuple[str, int]]:  # shuffled epochs, one after another
        while True:
            yield from random.sample(items, len(items))

    def decode(item: tuple[str, int]) -> tuple[Any, int]:
        packets = spdl.io.demux_image(item[0])
        top, left, h, w = crop_box(packets.height, packets.width, rng)
        flip = ",hflip" if rng.random() < 0.5 else ""
        desc = f"crop={w}:{h}:{left}:{top},scale={SIZE}:{SIZE}:flags=bilinear{flip}"
        frames = spdl.io.decode_packets(packets, filter_desc=f"{desc},format=pix_fmts=rgb24")
        return frames, item[1]

    def collate(batch: list[tuple[Any, int]]) -> tuple[Any, Any]:
        buffer = spdl.io.convert_frames([f for f, _ in batch])
        x = spdl.io.to_torch(buffer).permute(0, 3, 1, 2).to(torch.float32).div_(255)
        return x.sub_(mean).div_(std), torch.tensor([label for _, label in batch])

    pipeline = (
        PipelineBuilder()
        .add_source(source())
        .pipe(decode, concurrency=cfg["workers"])
        .aggregate(BATCH)
        .pipe(collate)
        .add_sink(3)
        .build(num_threads=cfg["workers"])
    )
    pipeline.start()

    class Endless:  # one "epoch" is the whole endless stream: the source never runs dry
        def __iter__(self) -> Iterator[Any]:
            return iter(pipeline.get_iterator(timeout=120))

    return Endless(), pipeline.stop


class MapAndCollate:
    """torchdata's migration guide: a batch of indices, mapped by the dataset, then collated."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, indices: list[int]) -> Any:
        from torch.utils.data import default_collate

        return default_collate([self.dataset[i] for i in indices])


def _make_torchdata(cfg: dict[str, Any], method: str) -> Any:
    import torchdata.nodes as tn
    from torch.utils.data import RandomSampler

    dataset = PillowFolder(list_folder(cfg["folder"]))
    node = tn.SamplerWrapper(RandomSampler(dataset))
    node = tn.Batcher(node, batch_size=BATCH, drop_last=False)
    node = tn.ParallelMapper(
        node,
        map_fn=MapAndCollate(dataset),
        num_workers=cfg["workers"],
        method=method,
        in_order=True,
    )
    node = tn.Prefetcher(node, prefetch_factor=cfg["workers"] * 2)
    return tn.Loader(node), None


def make_torchdata(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    return _make_torchdata(cfg, "thread")


def make_torchdata_proc(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    return _make_torchdata(cfg, "process")


def make_dataloader(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    import torch.utils.data

    loader = torch.utils.data.DataLoader(
        PillowFolder(list_folder(cfg["folder"])),  # type: ignore[arg-type]
        batch_size=BATCH,
        shuffle=True,
        num_workers=cfg["workers"],
        persistent_workers=True,
    )
    return loader, None


def _wds_sample(sample: tuple[Any, int]) -> tuple[Any, int]:
    return pillow_sample(sample[0], random.Random()), sample[1]


def make_webdataset(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    import webdataset as wds

    shards = wds_shards(cfg["folder"], Path(f"{cfg['folder']}-wds"))
    dataset = (
        wds.WebDataset(shards, shardshuffle=len(shards), nodesplitter=wds.split_by_node)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map(_wds_sample)
        .batched(BATCH, partial=True)
    )
    loader = wds.WebLoader(
        dataset, batch_size=None, num_workers=cfg["workers"], persistent_workers=True
    )
    return loader, None


def wds_shards(folder: Path, out: Path) -> list[str]:
    """The folder's JPEGs as WebDataset tars of 100 samples (`wds.ShardWriter`), written once;
    smaller where that would leave a worker without a shard (at least 8 shards)."""
    import webdataset as wds

    if not (out / ".complete").exists():
        out.mkdir(parents=True, exist_ok=True)
        items = list_folder(folder)
        random.Random(0).shuffle(items)
        per = max(1, min(100, len(items) // 8))
        with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=per, verbose=0) as sink:
            for i, (path, label) in enumerate(items):
                sink.write({"__key__": f"{i:07d}", "jpg": Path(path).read_bytes(), "cls": label})
        (out / ".complete").touch()
    return sorted(str(p) for p in out.glob("shard-*.tar"))


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    return {"image": Path(item[0]).read_bytes(), "label": item[1]}


def litdata_dir(folder: Path, out: Path) -> Path:
    """The folder's raw JPEG bytes in litdata's chunked format (`litdata.optimize`), once.
    Raw bytes, decoded by Pillow at read time: litdata's own JPEG serializer decodes with
    torchvision, which is not a dependency of this benchmark."""
    import io

    import litdata

    if not (out / ".complete").exists():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            litdata.optimize(
                fn=_litdata_item,
                inputs=list_folder(folder),
                output_dir=str(out),
                chunk_bytes="16MB",
                num_workers=1,
                mode="overwrite",
            )
        (out / ".complete").touch()
    return out


def _litdata_sample(item: dict[str, Any]) -> tuple[Any, int]:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(item["image"])) as im:
        return pillow_sample(im, random.Random()), item["label"]


def make_litdata(cfg: dict[str, Any]) -> tuple[Iterable[Any], Callable[[], None] | None]:
    import litdata

    data = litdata_dir(cfg["folder"], Path(f"{cfg['folder']}-litdata"))
    dataset = litdata.StreamingDataset(str(data), shuffle=True, transform=_litdata_sample)
    loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=cfg["workers"])
    return loader, None


FACTORIES: dict[str, Factory] = {
    "gpufeed": make_gpufeed,
    "gpufeed-nice0": make_gpufeed_nice0,
    "dali": make_dali,
    "spdl": make_spdl,
    "torchdata": make_torchdata,
    "torchdata-proc": make_torchdata_proc,
    "dataloader": make_dataloader,
    "webdataset": make_webdataset,
    "litdata": make_litdata,
}
