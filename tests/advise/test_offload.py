"""Offload advice: when the host's cores cannot keep up with the model, how many remote CPU
cores and how much network would (that `gpufeed diagnose` prints it: tests/test_cli.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufeed.advise.offload import offload_advice


def test_a_host_with_enough_cores_needs_no_offload():
    # 1 core makes 500 images/s; the model eats 1,000: 2 cores needed, the host gives 7
    advice = offload_advice(500, 1, 1000, host_cores=7)
    assert advice.cores_needed == pytest.approx(2.0)
    assert not advice.helps and advice.remote_cores == 0
    assert advice.text().startswith("offload to CPU nodes: not needed")


def test_a_host_short_of_cores_is_told_how_many_remote_cores_and_how_much_network():
    # ResNet-50 on an H100 (~4,000 images/s), 8 ms of CPU per image, 15 cores for the loader
    advice = offload_advice(250, 2, 4000, host_cores=15)
    assert advice.cores_needed == pytest.approx(32.0)
    assert advice.helps
    # 32 × 1.2 headroom, rounded up: all of it, since cluster= preprocesses everything on the
    # cluster (it said 39 - 15, as if the host's cores went on decoding beside it)
    assert advice.remote_cores == 39
    assert advice.network_bytes_per_s == pytest.approx(4000 * 224 * 224 * 3)  # every image
    assert "a Ray cluster of ~39 CPU cores" in advice.text() and "~4.8 Gbit/s" in advice.text()


def test_no_remote_cores_for_training_that_hardly_waits_for_data():
    # 16-core H100 host: the loader alone is a little slower than RN-50 alone, but end to end
    # training waits 5% of the time: "compute-bound", and remote cores would gain at most 5%
    sizes = (2900, 15, 3000, 15)
    assert offload_advice(*sizes).helps  # the sizes alone say 16 cores > 15
    advice = offload_advice(*sizes, data_wait_share=0.05)
    assert not advice.helps and advice.remote_cores == 0 and advice.network_bytes_per_s == 0
    assert advice.text().startswith(
        "offload to CPU nodes: not needed, training waits for data only 5% of the time; "
        "preprocessing needs 15.5 cores"
    )
    assert offload_advice(*sizes, data_wait_share=0.3).helps


def test_the_advice_names_a_readme_section_that_exists():
    # it said README 'Ray cluster', a heading the README does not have
    text = offload_advice(250, 2, 4000, host_cores=15).text()
    named = re.search(r'README "([^"]+)"', text)
    assert named, text
    readme = Path(__file__).resolve().parents[2] / "README.md"
    assert f"### {named.group(1)}" in readme.read_text().splitlines()


def test_more_workers_than_cores_keep_only_the_cores_busy():
    # 50 workers on a 2-core host (1 for the loader beside training) made 500 images/s alone:
    # 2 cores were busy, not 50, so an image costs 4 ms, and 1,000 images/s need 4 cores
    advice = offload_advice(500, 50, 1000, host_cores=1)
    assert advice.cpu_s_per_image == pytest.approx(2 / 500)
    assert advice.cores_needed == pytest.approx(4.0)
    assert "this host gives the loader 1 core" in advice.text()


def test_the_measured_cpu_per_image_counts_where_the_workers_were_not_busy():
    # 2 workers making 250 images/s could cost 8 ms an image, but they slept: 0.1 ms measured
    advice = offload_advice(250, 2, 4000, host_cores=15, cpu_s_per_image=0.0001)
    assert advice.cpu_s_per_image == pytest.approx(0.0001) and not advice.helps
    # a measure above what the cores could spend (another process's CPU) is capped by them
    assert offload_advice(250, 2, 4000, 15, cpu_s_per_image=0.02).cpu_s_per_image == 2 / 250


def test_rates_that_are_not_positive_are_refused():
    with pytest.raises(ValueError, match="positive"):
        offload_advice(0, 1, 100, host_cores=4)
