"""The device stage: turn a filled host slot into the batch the training loop receives.

It runs on the feeder thread, never on the training thread, and on CUDA in its own
high-priority stream, so its few kernels slot in between the training step's:
- "decoded" slots (uint8 N×H×W×3 from CPU workers): one DMA copy from the page-locked slot, then
  one fused kernel for float conversion, normalization and layout (channels_last is free: the
  slot already is N×H×W×3). When the device is the CPU, workers already wrote the final batch:
  the loop gets the slot itself, lent (`lending`), or, where its worker has none to spare, a copy
  in an output batch the loop has let go of (`outputs`);
- "first_pass" slots (the same, after only the first warp of the load block, with the sampling
  matrices of the others): the same copy, then the other warps, batched, and normalization
  (`decoder="workers"`: the CPU decodes, the GPU does the heavy part of the augmentation);
- "encoded" slots (JPEG bytes, with sizes and random parameters drawn by the workers): in two
  steps on two threads and streams, so decoding batch k+1 overlaps resampling batch k:
  `from_slot` = a batched decode into one zero-padded canvas, by NVIDIA DALI (`gpufeed.data.dali`:
  the hardware JPEG decoder, own memory pools and streams) or nvJPEG through torchvision;
  `resample` = crop + resize + the first augmentation warp as ONE batched, supersampled bilinear
  resampling of all images (`sample_canvases`), then the other warps and normalization, batched.
  Who decodes (`BatchSpec.decoder`, the device) is `decoders`' choice.
Random parameters come from the same per-batch generator as on CPU workers, so both paths draw
the same crops, flips and angles.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpufeed.data.augment import _normalizer
from gpufeed.data.batch import CorruptSampleError, batch_generator, build_batch, cpu_decoder
from gpufeed.data.canvases import fill_canvases, padded_canvases, sample_canvases
from gpufeed.data.dali import DaliDecoder
from gpufeed.data.dataset import RawSample
from gpufeed.data.decoders import (  # noqa: F401 - also imported from here
    decoder_name,
    describe_decoder,
    nvjpeg_available,
    open_decoder,
)
from gpufeed.data.jpeg_region import workers_decoder
from gpufeed.data.outputs import OutputPool
from gpufeed.data.plan import Position
from gpufeed.data.sample_extras import columns
from gpufeed.data.slot_meta import SlotMeta
from gpufeed.data.slots import Slots
from gpufeed.data.spec import BatchSpec
from gpufeed.errors import OptionError


@dataclass
class DeviceBatch:
    """A batch on its way to the training loop: ready once `ready` (a CUDA event) has passed."""

    at: Position
    images: torch.Tensor
    labels: torch.Tensor
    ready: Any
    corrupt: list[tuple[str, str, str]]
    retried: int
    extras: tuple[list[Any], ...] = ()  # with `extras=`: one list per name (sample_extras)


@functools.cache
def threads_are_per_thread() -> bool:
    """Whether `torch.set_num_threads` in one thread leaves the others as they are: so with
    torch's OpenMP backend (its setting is per thread), not with its native thread pool."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


class DeviceStage:
    """Slot → `DeviceBatch` on `device`, for one `BatchSpec`."""

    def __init__(
        self,
        spec: BatchSpec,
        device: torch.device,
        slots: Slots,
        *,
        pinned: bool,
        seed: int,
        rank: int,
    ) -> None:
        aug = spec.augment
        if aug.transform is not None and aug.transform_on == "worker" and spec.handoff != "decoded":
            raise OptionError(
                "Augment(transform_on='worker') needs preprocess='cpu': with GPU preprocessing "
                "the workers do not finish the augmentation; use transform_on='device'"
            )
        self.spec, self.device, self.slots, self.pinned = spec, device, slots, pinned
        self.seed, self.rank = seed, rank
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device, priority=-1) if self.cuda else None
        self.scale, shift = _normalizer(spec.augment.mean, spec.augment.std, device)
        self.neg_shift = -shift
        self.decoder, self.library = open_decoder(spec, device)
        # on CUDA, two steps on two threads: decode (from_slot) and resample, each its own
        # stream; DALI or nvImageCodec on the CPU do both on the feeder thread
        self.split = self.cuda and self.decoder in ("dali", "nvimgcodec", "nvjpeg")
        self.stream2 = torch.cuda.Stream(device, priority=-1) if self.split else None
        self.seconds = {"wait_workers": 0.0, "from_slot": 0.0, "resample": 0.0}
        # CPU batches, reused: those the feeder keeps ready, the loop's, and the one being made
        self.outputs = OutputPool(keep=4)
        self.decoder_name = describe_decoder(self.decoder, device, spec)
        # on a CPU device, batches the workers finished only need converting: one thread does it
        # (more would wake OpenMP threads that spin in the training process beside the workers)
        self.one_thread = (
            not self.cuda
            and spec.handoff == "decoded"
            and not (aug.transform is not None and aug.transform_on == "device")
            and threads_are_per_thread()
        )

    def from_slot(
        self, at: Position, index: int, meta: SlotMeta, lend: torch.Tensor | None = None
    ) -> tuple[Any, Any]:
        """Step one, from the slot: (a DeviceBatch, or what `resample` finishes if `split`; an
        event after which the slot may be reused, or None: at once). With `lend` (the slot's
        images, from a `lending.Lender`; only where the workers wrote the final batch, on the
        CPU: `BatchSpec.host_final`) the batch is a view of it, not a copy."""
        t = time.perf_counter()
        try:
            if self.stream is None:
                return self._from_slot(at, index, meta, lend)
            with torch.cuda.stream(self.stream):
                return self._from_slot(at, index, meta, lend)
        finally:
            self.seconds["from_slot"] += time.perf_counter() - t

    def _from_slot(
        self, at: Position, index: int, meta: SlotMeta, lend: torch.Tensor | None
    ) -> tuple[Any, Any]:
        n = meta.n
        if self.spec.handoff != "encoded":
            (images, labels), done = self._decoded(index, n, lend)
            corrupt = list(meta.corrupt)
        elif self.decoder == "nvjpeg":
            return self._decode_to_canvas(at, index, meta)
        elif self.library is not None:
            part = self._library_to_canvas(at, index, meta)
            return (part, None) if self.split else (self._resample(part), None)
        else:
            (images, labels), done, corrupt = self._encoded_cpu(at, index, n, meta.keys)
        return self._batch(at, images, labels, corrupt, meta, self.stream), done

    def resample(self, part: Any) -> DeviceBatch:
        """Step two (only when `split`): resample the decoded canvas into the batch."""
        t = time.perf_counter()
        try:
            with torch.cuda.stream(self.stream2):
                return self._resample(part)
        finally:
            self.seconds["resample"] += time.perf_counter() - t

    def _batch(
        self,
        at: Position,
        images: torch.Tensor,
        labels: torch.Tensor,
        corrupt: list[tuple[str, str, str]],
        meta: SlotMeta,
        stream: Any,
    ) -> DeviceBatch:
        aug = self.spec.augment
        if aug.transform is not None and aug.transform_on == "device":
            images = aug.transform(images)
        ready = None
        if stream is not None:
            ready = torch.cuda.Event()
            ready.record(stream)
        extras = columns(meta, corrupt)  # the kept samples' keys and members, if asked for
        return DeviceBatch(at, images, labels, ready, corrupt, meta.retried, extras)

    # --- decoded, first_pass: copy, then the later warps (first_pass) and normalize ---------

    def _decoded(
        self, index: int, n: int, lend: torch.Tensor | None = None
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], Any]:
        src = self.slots.images[index, :n] if lend is None else lend[:n]
        labels = self.slots.labels[index, :n]
        warps = self.slots.params[index, :n]
        if warps.numel():  # "first_pass": the later warps' matrices
            warps = self.spec.params.unpack(warps)["warps"]
        if self.cuda:
            x = torch.empty(src.shape, dtype=torch.uint8, device=self.device)
            x.copy_(src, non_blocking=self.pinned)
            y = torch.empty(n, dtype=torch.int64, device=self.device)
            y.copy_(labels, non_blocking=self.pinned)
            w = warps
            if warps.numel():  # "first_pass": the later warps' matrices
                w = torch.empty(warps.shape, dtype=warps.dtype, device=self.device)
                w.copy_(warps, non_blocking=self.pinned)
            done = torch.cuda.Event()
            done.record(self.stream)
            return (self._finish(x.permute(0, 3, 1, 2), w), y), done
        # the slot is reused once this returns: hand out a copy, never a view of it, unless
        # it is lent (the lender gives it back only once nothing holds the view)
        x = src.permute(0, 3, 1, 2) if src.shape[-1] == 3 else src
        if lend is not None:
            return (x, labels.clone()), None
        if warps.numel():
            return (self._finish(x, warps), labels.clone()), None
        if self.spec.host_final or self.spec.dtype == torch.uint8:
            out = self.outputs.take(tuple(x.shape), x.dtype, self._format())
            return (out.copy_(x), labels.clone()), None
        return (self.normalize(x), labels.clone()), None

    def _format(self) -> torch.memory_format:
        return torch.channels_last if self.spec.channels_last else torch.contiguous_format

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=self._format())

    def _finish(self, x: torch.Tensor, warps: torch.Tensor) -> torch.Tensor:
        """uint8 N×3×H×W after the first warp → the other warps (`warps`: N × 6 per warp, on
        x's device), then normalization into the spec's dtype and layout."""
        if not warps.numel():
            return self.normalize(x)
        thetas = [t.float() for t in warps.reshape(len(x), -1, 2, 3).unbind(1)]
        out = torch.empty(
            x.shape, dtype=self.spec.dtype, device=x.device, memory_format=self._format()
        )
        return self.spec.augment.finish(x, thetas, out)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 N×3×H×W (any layout) → the spec's dtype and layout, normalized: one kernel."""
        if self.spec.dtype == torch.uint8:
            return self._layout(x)
        out = torch.empty(
            x.shape, dtype=self.spec.dtype, device=x.device, memory_format=self._format()
        )
        return torch.addcmul(self.neg_shift, x, self.scale, out=out)

    # --- encoded: decode on the device ------------------------------------------------------

    def _encoded_cpu(
        self, at: Position, index: int, n: int, keys: Sequence[tuple[str, str]]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], Any, list[tuple[str, str, str]]]:
        """No nvJPEG: libjpeg-turbo here, the ops on the device (the same batch as on workers)."""
        buf = self.slots.images[index].numpy()
        offs = self.slots.offsets[index, : n + 1].tolist()
        labels = self.slots.labels[index, :n].tolist()
        samples = [
            RawSample(s, k, labels[i], buf[offs[i] : offs[i + 1]].tobytes())
            for i, (s, k) in enumerate(keys)
        ]
        images, y, corrupt = build_batch(
            samples,
            self.spec.augment,
            batch_generator(self.seed, at.epoch, self.rank, at.batch),
            dtype=self.spec.dtype,
            channels_last=self.spec.channels_last,
            strict=self.spec.strict,
            decoder=workers_decoder(self.spec.decoder, self.spec.decode_threads),
            device=self.device,
        )
        return (images, y.to(self.device, non_blocking=True)), None, corrupt

    def _decode_to_canvas(self, at: Position, index: int, meta: SlotMeta) -> tuple[Any, Any]:
        import torchvision.io as tvio

        n, keys = meta.n, meta.keys
        bad: dict[int, str] = dict(meta.bad)
        buf = self.slots.images[index]
        offs = self.slots.offsets[index, : n + 1].tolist()
        # one call, not one per image: every Python-level call here waits for the GIL, which
        # the training thread holds most of the time
        views = list(torch.split(buf[: offs[n]], [b - a for a, b in itertools.pairwise(offs)]))
        ok = [i for i in range(n) if i not in bad]
        decoded: dict[int, torch.Tensor] = {}
        try:
            imgs = tvio.decode_jpeg(
                [views[i] for i in ok], mode=tvio.ImageReadMode.RGB, device=self.device
            )
            decoded = dict(zip(ok, imgs, strict=True))
        except RuntimeError:  # one bad image fails the batch: find it one by one
            for i in ok:
                try:
                    decoded[i] = tvio.decode_jpeg(
                        views[i], mode=tvio.ImageReadMode.RGB, device=self.device
                    )
                except RuntimeError as e:
                    bad[i] = f"cannot decode image: {e}"
        for i in [i for i in bad if bad[i] == "not a JPEG"]:  # PNG and such: on the CPU
            img = cpu_decoder([views[i].numpy().tobytes()], [(0, 0)])[0]
            if not isinstance(img, Exception):
                decoded[i] = img.permute(2, 0, 1).to(self.device, non_blocking=True)
                del bad[i]
        corrupt = self._report(keys, bad)
        keep = sorted(decoded)
        canvases = fill_canvases([decoded[i] for i in keep])
        # The slot's bytes are read and the decoded images copied: the feeder waits for this
        # before the next decode. torchvision allocates its outputs on this stream but writes
        # them from its own, without waiting for this one: the next batch's images could land
        # in these images' memory (freed on return) while the fill above still reads it.
        filled = torch.cuda.Event()
        filled.record(self.stream)
        params = self.slots.params[index, :n][keep]
        labels = self.slots.labels[index, :n][keep]
        part = (at, canvases, params, labels, corrupt, meta, filled)
        return part, filled

    def _library_to_canvas(self, at: Position, index: int, meta: SlotMeta) -> Any:
        """DALI (one padded batch) or nvImageCodec (one image each) decodes the slot's images,
        made float canvases here; the slot may be reused at once (both are done reading it)."""
        n, keys = meta.n, meta.keys
        # both decode PNG and the like too: only images with an unreadable header are left out
        bad = {i: why for i, why in meta.bad.items() if why != "not a JPEG"}
        buf = self.slots.images[index].numpy()
        offs = self.slots.offsets[index, : n + 1].tolist()
        ok = [i for i in range(n) if i not in bad]
        data = [buf[offs[i] : offs[i + 1]] for i in ok]
        if isinstance(self.library, DaliDecoder):
            padded, failed = self.library.decode_each(data, self.stream)
            canvases = [] if padded is None else padded_canvases(padded)
        else:
            assert self.library is not None
            images, failed = self.library.decode_each(data, self.stream)
            canvases = fill_canvases([im.permute(2, 0, 1) for im in images])
        bad.update({ok[j]: why for j, why in failed.items()})
        corrupt = self._report(keys, bad)
        keep = [i for i in ok if i not in bad]
        filled = None
        if self.cuda:
            filled = torch.cuda.Event()
            filled.record(self.stream)
        params = self.slots.params[index, :n][keep]
        labels = self.slots.labels[index, :n][keep]
        return (at, canvases, params, labels, corrupt, meta, filled)

    def _report(
        self, keys: Sequence[tuple[str, str]], bad: dict[int, str]
    ) -> list[tuple[str, str, str]]:
        """(shard, key, why) of the images left out; raises the first in strict mode."""
        corrupt = [(keys[i][0], keys[i][1], bad[i]) for i in sorted(bad)]
        if corrupt and self.spec.strict:
            shard, key, why = corrupt[0]
            raise CorruptSampleError(f"corrupt sample in shard {shard}, key {key}: {why}")
        return corrupt

    def _resample(self, part: Any) -> DeviceBatch:
        at, canvases, params, labels, corrupt, meta, decoded = part
        stream = self.stream2 if self.split else None
        if stream is not None:
            stream.wait_event(decoded)
            for canvas in canvases:
                canvas.record_stream(stream)
        aug = self.spec.augment
        drawn = self.spec.params.unpack(params)
        boxes = [tuple(b) for b in drawn["box"].long().tolist()]
        hflip, vflip = drawn["hflip"].T.bool(), drawn["vflip"].T.bool()
        angle = drawn["angle"].T.float()
        # page-locked, so that copying them to the device does not wait for the stream
        warps = aug.warps((hflip, vflip, angle))
        if self.cuda:
            warps = [w.pin_memory() for w in warps]
        if canvases:
            x = sample_canvases(canvases, boxes, warps[0] if warps else None, aug.size)
        else:  # every image of the batch was corrupt
            x = torch.empty((0, 3, *aug.size), device=self.device)
        out = torch.empty(
            (len(boxes), 3, *aug.size),
            dtype=self.spec.dtype,
            device=self.device,
            memory_format=self._format(),
        )
        aug.finish(x, warps[1:], out, owned=True)
        y = labels.pin_memory().to(self.device, non_blocking=True) if self.cuda else labels
        return self._batch(at, out, y, corrupt, meta, stream)
