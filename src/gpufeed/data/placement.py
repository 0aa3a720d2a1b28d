"""Where each stage of making a batch runs: in the loader's workers or on the device stage.

One value per stage, in pipeline order; what a worker hands over (`handoff`) follows from the
first stage placed on the device, so no stage reads an opaque mode string to learn its job.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

PLACES = ("workers", "device")
# "decode": JPEG bytes to pixels; "resample": crop, resize and the load block's first warp in one
# resampling; "warps": the load block's other warps; "normalize": float conversion, mean and std.
STAGES = ("decode", "resample", "warps", "normalize")


@dataclass(frozen=True)
class Placement:
    """Where each stage runs. A stage placed on the device takes every later stage with it (a
    worker cannot run a stage after the device has)."""

    decode: str = "workers"
    resample: str = "workers"
    warps: str = "workers"
    normalize: str = "device"

    def __post_init__(self) -> None:
        on_device = False
        for f in fields(self):
            place = getattr(self, f.name)
            if place not in PLACES:
                raise ValueError(f"Placement {f.name}={place!r}: one of {', '.join(PLACES)}")
            if on_device and place == "workers":
                raise ValueError(
                    f"Placement {f.name}='workers' after a stage on the device: {self}"
                )
            on_device = on_device or place == "device"

    @classmethod
    def of(cls, handoff: str, host_final: bool = False) -> Placement:
        """The placement whose hand-off is `handoff` ("decoded", "first_pass", "encoded");
        `host_final`: "decoded" with normalization in the workers too."""
        if handoff == "encoded":
            return cls("device", "device", "device", "device")
        if handoff == "first_pass":
            return cls(warps="device")
        if handoff == "decoded":
            return cls(normalize="workers" if host_final else "device")
        raise ValueError(f"handoff={handoff!r}: one of decoded, first_pass, encoded")

    @property
    def handoff(self) -> str:
        """What a worker puts in its slot: "encoded" (the image bytes, decoded on the device),
        "first_pass" (uint8 pixels after the first warp, with the other warps' matrices) or
        "decoded" (uint8 pixels augmented but for normalization, or the final batch)."""
        if self.decode == "device":
            return "encoded"
        if self.resample == "device":
            raise ValueError("resampling on the device needs decoding there too")
        return "first_pass" if self.warps == "device" else "decoded"

    @property
    def host_final(self) -> bool:
        """Whether the workers write the final batch (normalized, in the loop's dtype)."""
        return self.normalize == "workers"
