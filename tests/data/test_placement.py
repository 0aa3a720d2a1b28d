"""Where each stage runs is one value per stage, and what a worker hands over follows from it."""

from __future__ import annotations

import pytest

from gpufeed.data.placement import STAGES, Placement


@pytest.mark.parametrize(
    ("placement", "handoff", "host_final"),
    [
        (Placement(), "decoded", False),
        (Placement(normalize="workers"), "decoded", True),
        (Placement(warps="device"), "first_pass", False),
        (Placement("device", "device", "device", "device"), "encoded", False),
    ],
)
def test_the_handoff_follows_from_the_first_stage_on_the_device(
    placement: Placement, handoff: str, host_final: bool
):
    assert (placement.handoff, placement.host_final) == (handoff, host_final)
    assert Placement.of(handoff, host_final) == placement


def test_the_stages_are_the_placement_fields_in_pipeline_order():
    assert tuple(Placement.__dataclass_fields__) == STAGES


def test_a_stage_cannot_run_in_the_workers_after_one_on_the_device():
    with pytest.raises(ValueError, match="normalize='workers' after a stage on the device"):
        Placement(warps="device", normalize="workers")


def test_an_unknown_place_is_named():
    with pytest.raises(ValueError, match="decode='gpu': one of workers, device"):
        Placement(decode="gpu")


def test_resampling_on_the_device_needs_decoding_there():
    with pytest.raises(ValueError, match="needs decoding there too"):
        _ = Placement(resample="device", warps="device").handoff


def test_an_unknown_handoff_is_named():
    with pytest.raises(ValueError, match="handoff='raw'"):
        Placement.of("raw")
