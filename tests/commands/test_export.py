"""`gpufeed export RUN --tensorboard DIR`: scalars that TensorBoard's own event reader reads back."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def _read(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


@pytest.fixture
def run_dir(make_run) -> Path:
    # rank 0's steps: 0 over (1010.0, 1010.5], 1 over (1010.5, 1010.75]; samples at 1009 (before
    # the first step) and 1012 (after the last) belong to no step
    return make_run(
        host="node-a",
        system=[
            (1009.0, "cpu.util", "", 10.0),
            (1010.2, "cpu.util", "", 40.0),
            (1010.4, "cpu.util", "", 60.0),
            (1010.6, "cpu.util", "", 80.0),
            (1012.0, "cpu.util", "", 10.0),
            (1010.2, "gpu.util", "0", 90.0),
            (1010.6, "gpu.util", "0", 30.0),
            (1010.2, "mem.used", "", 2 * 2**30),
            (1010.2, "net.rx", "", 5e6),
            (1010.2, "gpu.mem_used", "0", 3 * 2**30),
            (1010.2, "gpu.power", "0", 250.0),
        ],
        ranks={
            0: [(0, 1010.0, 1010.5, 0.25, 32.0, None), (1, 1010.5, 1010.75, 0.05, 32.0, None)],
            1: [(0, 1010.0, 1011.0, 0.5, 32.0, None)],
        },
        processes=[
            (1010.2, 100, "main", 95.0, 1e9),
            (1010.2, 555, "worker", 20.0, 5e8),
            (1010.2, 556, "worker", 30.0, 5e8),
            (1010.4, 555, "worker", 10.0, 5e8),
        ],
    )


def test_steps_and_system_metrics_read_back_with_tensorboards_reader(
    run_dir, tmp_path, gpufeed_cli
):
    out = tmp_path / "tb"
    cp = subprocess.run(
        gpufeed_cli("export", str(run_dir), "--tensorboard", str(out)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    assert f"tensorboard --logdir {out}" in cp.stdout
    assert [p.name for p in out.iterdir()] == [run_dir.name]  # one folder per run
    out = out / run_dir.name

    rank0 = _read(out / "node-a" / "rank0")
    assert rank0["step/time_ms"] == [
        (0, pytest.approx(500.0), 1010.5),
        (1, pytest.approx(250.0), 1010.75),
    ]
    assert [v for _, v, _ in rank0["step/data_wait_ms"]] == pytest.approx([250.0, 50.0])
    assert [v for _, v, _ in rank0["step/throughput_samples_per_s"]] == pytest.approx([64.0, 128.0])
    assert "step/gpu_time_ms" not in rank0  # never invented on CPU
    assert [v for _, v, _ in _read(out / "node-a" / "rank1")["step/time_ms"]] == pytest.approx(
        [1000.0]
    )

    system = _read(out / "node-a" / "system")
    # on the training-step axis: per step the mean of its samples, at the step's end
    assert system["system/cpu.util_percent"] == [
        (0, pytest.approx(50.0), 1010.5),
        (1, pytest.approx(80.0), 1010.75),
    ]
    assert system["system/gpu.util_percent/0"] == [(0, 90.0, 1010.5), (1, 30.0, 1010.75)]
    assert [v for _, v, _ in system["system/mem.used_GiB"]] == pytest.approx([2.0])
    assert [v for _, v, _ in system["system/net.rx_MBps"]] == pytest.approx([5.0])
    assert [v for _, v, _ in system["system/gpu.mem_used_GiB/0"]] == pytest.approx([3.0])
    assert [v for _, v, _ in system["system/gpu.power_W/0"]] == pytest.approx([250.0])
    # summed over the role's processes per sample time (50%, then 10%), then the step's mean
    assert system["processes/cpu_worker_percent"] == [(0, pytest.approx(30.0), 1010.5)]


def test_export_without_a_target_says_what_to_give(run_dir, gpufeed_cli):
    cp = subprocess.run(gpufeed_cli("export", str(run_dir)), capture_output=True, text=True)
    assert cp.returncode == 2
    assert "--tensorboard DIR" in cp.stderr and "Traceback" not in cp.stderr


def test_an_empty_run_is_refused_by_name(make_run, tmp_path):
    from gpufeed.commands.export import export_tensorboard
    from gpufeed.present.tensorboard import ExportError

    empty = make_run()
    with pytest.raises(ExportError, match="nothing to export"):
        export_tensorboard(empty, tmp_path / "tb", echo=lambda _: None)
    assert not (tmp_path / "tb").exists()


def test_the_training_threads_cpu_while_it_waited_is_a_scalar_where_it_was_measured(run_dir):
    import gpufeed
    from gpufeed.analysis.step_scalars import step_scalars
    from gpufeed.profiler.session import steps_store_path
    from gpufeed.profiler.store import Store

    def tags(rank: str) -> set[str]:
        return {tag for tag, *_ in step_scalars(gpufeed.load(run_dir))[f"node-a/{rank}"]}

    assert "step/data_wait_cpu_ms" not in tags("rank0")  # never invented
    store = Store(steps_store_path(run_dir, "node-a", 100))  # rank 0's
    store.write(cpu_phases=[(0, 0.2, 0.03), (1, 0.01, 0.0)])
    store.close()
    rank0 = step_scalars(gpufeed.load(run_dir))["node-a/rank0"]
    waits = [(step, v) for tag, step, v, _ in rank0 if tag == "step/data_wait_cpu_ms"]
    assert waits == [(0, pytest.approx(200.0)), (1, pytest.approx(10.0))]
    ready = [(step, v) for tag, step, v, _ in rank0 if tag == "step/data_wait_ready_ms"]
    assert ready == [(0, pytest.approx(30.0)), (1, 0.0)]


def test_two_runs_exported_into_one_folder_stay_apart_and_a_second_export_is_refused(
    make_run, tmp_path
):
    from gpufeed.commands.export import export_tensorboard
    from gpufeed.present.tensorboard import ExportError

    steps = {0: [(0, 1010.0, 1010.5, 0.25, 32.0, None)]}
    first, second = make_run(ranks=steps), make_run(ranks=steps)
    out = tmp_path / "tb"
    for run in (first, second):
        export_tensorboard(run, out, echo=lambda _: None)
    assert sorted(p.name for p in out.iterdir()) == [first.name, second.name]
    for run in (first, second):
        assert _read(out / run.name / "h1" / "rank0")["step/time_ms"][0][1] == pytest.approx(500.0)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(
        ExportError, match=rf"{out / first.name} already holds an export of this run"
    ):
        export_tensorboard(first, out, echo=lambda _: None)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_folder_name_that_is_not_utf8_is_refused_before_writing(run_dir, tmp_path):
    from typer.testing import CliRunner

    from gpufeed.cli import app

    target = os.fsdecode(bytes(tmp_path) + b"/r\xffuns")
    res = CliRunner().invoke(app, ["export", str(run_dir), "--tensorboard", target])
    assert res.exit_code == 2 and "--tensorboard" in res.stderr and "r\\xffuns" in res.stderr
    assert "not valid UTF-8" in res.stderr and not os.path.exists(target)


def test_system_scalars_read_back_at_the_step_that_ran_at_their_time(make_run, tmp_path):
    """Steps of uneven length with a gap (an evaluation pass); a second rank on the host with other
    timing, and a second host without training steps: every host's samples sit on rank 0's steps."""
    import numpy as np

    from gpufeed.commands.export import export_tensorboard

    rng = np.random.default_rng(3)
    durations = rng.uniform(0.03, 0.6, 40)
    gaps = np.zeros(40)
    gaps[25] = 0.7  # nothing trains for 0.7 s before step 25
    ends = 1010.0 + np.cumsum(durations + gaps)
    starts = ends - durations
    spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
    rank0 = [(i, a, b, 0.0, 8.0, None) for i, (a, b) in enumerate(spans)]
    rank1 = [(i, a + 0.13, b + 0.13, 0.0, 8.0, None) for i, (a, b) in enumerate(spans)]
    times = np.arange(1009.0, ends[-1] + 1.0, 0.25)
    values = rng.uniform(0, 100, len(times))
    samples = [(t, "cpu.util", "", v) for t, v in zip(times.tolist(), values.tolist(), strict=True)]
    parts = [
        make_run(host="node-a", system=samples, ranks={0: rank0, 1: rank1}),
        make_run(host="node-b", system=samples, meta={"hosts": ["node-b"]}),
    ]
    export_tensorboard(parts, tmp_path / "tb", echo=lambda _: None)

    expected = []  # (step, mean of its samples, its end) for the steps that got samples
    for i, (a, b) in enumerate(spans):
        inside = (times > a) & (times <= b) if i else (times >= a) & (times <= b)
        if inside.any():
            expected.append((i, pytest.approx(values[inside].mean(), rel=1e-6), b))
    assert 15 < len(expected) < 40  # some steps are shorter than the sampling interval
    for host in ("node-a", "node-b"):
        scalars = _read(tmp_path / "tb" / parts[0].name / host / "system")
        assert scalars["system/cpu.util_percent"] == expected
    # TensorBoard keeps one value per step: every tag's steps strictly increase
    for series in _read(tmp_path / "tb" / parts[0].name / "node-a" / "system").values():
        steps = [step for step, _, _ in series]
        assert steps == sorted(set(steps))


def test_system_and_process_scalars_of_one_sample_time_share_its_step(jittered_hosts):
    """Without training steps, system samples are stepped by sample time: one index per time."""
    import gpufeed
    from gpufeed.analysis.step_scalars import step_scalars

    run = jittered_hosts(hosts=1)
    run = gpufeed.analysis.run.Run(
        run.path, run.meta, run.system, run.steps, run.processes.iloc[1:]
    )  # the process sampler missed the first sample
    rows = step_scalars(run)["node0/system"]
    step_at = {wall: step for tag, step, _, wall in rows if tag.startswith("system/")}
    cpu = [(step, wall) for tag, step, _, wall in rows if tag == "processes/cpu_main_percent"]
    assert len(cpu) == run.processes["time"].nunique() > 10
    assert all(step == step_at[wall] for step, wall in cpu)
