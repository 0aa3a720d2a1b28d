"""`gpufeed demo`: the whole story in a few minutes, on the embedded photo-like data set.

1. generate the images once (cached in the work dir);
2. train a small ResNet with the naive pipeline (Pillow full decode, per-image augmentation, too few
   workers) under `gpufeed profile`, as a user would, and show the findings;
3. pack the images pre-resized into shards, train the same model, batch, image size and number of
   steps with the gpufeed loader under the profiler;
4. return both runs: the result prints itself (`__rich__`) as the before/after table with the
   measured speedup and the two HTML reports; progress goes to stderr.

Its sizes, option checks, errors and work dir are `demo_options`'.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.demo.demo_options import (  # noqa: F401  (their old home: the CLI, tests)
    DEFAULT_WORK_DIR,
    GPU_IMAGE_SIZE,
    TINY,
    WORK_MARKER,
    DemoConfig,
    DemoError,
    DemoOptionError,
    claim_work_dir,
    demo_config,
)

if TYPE_CHECKING:
    from rich.console import Group
    from rich.text import Text

    from gpufeed.analysis.run import Run


@dataclass
class PipelineResult:
    """One profiled training run: what the script measured plus what the profiler saw."""

    pipeline: str
    run_dir: Path
    report: Path
    images_per_s: float  # profiler: samples over step time, after 3 warm-up steps
    wall_images_per_s: float  # the training script: images over wall time after its warm-up
    data_wait_share: float
    cpu_util: float
    gpu_util: float
    steps: int
    workers: int
    findings: list[dict[str, Any]]


@dataclass
class DemoResult:
    """Both runs and the measured speedup (gpufeed images/s over naive images/s)."""

    config: DemoConfig
    naive: PipelineResult
    gpufeed: PipelineResult

    def __rich__(self) -> Group:
        """The naive run's findings, the before/after table, the measured speedup, what to do
        next and where the reports are: what `gpufeed demo` prints at the end."""
        return _render(self)

    @property
    def speedup(self) -> float:
        return self.gpufeed.images_per_s / self.naive.images_per_s

    @property
    def after_input_bound(self) -> bool:
        """Whether the gpufeed ("after") run still waits for data `STILL_WAITING` of its steps."""
        return self.gpufeed.data_wait_share >= STILL_WAITING

    def to_json(self) -> str:
        """Config, speedup and both runs; paths as strings, unmeasured figures (NaN) as null."""

        def plain(r: PipelineResult) -> dict[str, Any]:
            return {
                k: str(v) if isinstance(v, Path) else None if v != v else v  # NaN != NaN
                for k, v in vars(r).items()
            }

        doc = {
            "config": asdict(self.config),
            "speedup": self.speedup,
            "after_input_bound": self.after_input_bound,
            "next_step": next_step(self),
            "naive": plain(self.naive),
            "gpufeed": plain(self.gpufeed),
        }
        return json.dumps(doc, indent=2)


STILL_WAITING = 0.1  # the "after" run waiting for data this share of step time: still input-bound
_INPUT_RULES = ("DataLoaderBottleneck", "CPUBottleneck", "IOBottleneck")


def next_step(result: DemoResult) -> str:
    """What the "after" run says to do next: still input-bound (and why) or the model's turn."""
    after = result.gpufeed
    gpu = f", GPU {after.gpu_util:.0f}% busy" if after.gpu_util == after.gpu_util else ""
    if result.after_input_bound:
        advice = next(
            (f["recommendation"] for f in after.findings if f.get("rule") in _INPUT_RULES), None
        )
        return (
            f"The gpufeed run is still input-bound: its steps wait for data "
            f"{after.data_wait_share:.0%} of the time{gpu}. Next: "
            + (
                advice
                or "give the loader more cores (num_workers), pre-resize the shards "
                "(`gpufeed pack --resize`), preprocess on the GPU, or find the settings with "
                "`gpufeed tune --model ...`."
            )
        )
    return (
        f"The gpufeed run is no longer input-bound (data wait {after.data_wait_share:.0%}{gpu}): "
        "the model is the limit now. Next: a larger batch, bf16 autocast, channels_last or "
        "torch.compile, and profile your own job with `gpufeed profile`."
    )


def demo_images(
    work: Path, cfg: DemoConfig, on_images: Callable[[int], None] = lambda n: None
) -> Path:
    """The image folder for this configuration, generated once (then reused).

    `on_images(n)` hears how many images exist while they are generated (counted on disk by a
    watcher thread, since the generator has no callback)."""
    import threading

    from gpufeed.demo.synth import make_image_folder

    lo, hi = cfg.short_side
    root = work / "data" / f"images-{cfg.images}x{cfg.classes}-{lo}-{hi}"
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            on_images(sum(1 for _ in root.glob("*/*.jpg")))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        images = make_image_folder(root, cfg.images, cfg.classes, short_side=cfg.short_side)
    finally:
        done.set()
        watcher.join()
    on_images(cfg.images)
    return images


def demo_shards(images: Path, cfg: DemoConfig) -> Path:
    """The images packed into shards pre-resized for the training size, once (then reused).

    A pack there of other inputs is replaced: the demo made that folder, and a work dir that was
    renamed or copied holds one (a pack is known by the absolute paths of its images)."""
    import warnings

    from gpufeed.data.packing import pack_cache

    shards = images.parent / f"{images.name.replace('images-', 'shards-')}-r{cfg.pack_resize}"
    with warnings.catch_warnings():  # the demo set is far below the 1-128 MB shard advice
        warnings.simplefilter("ignore")
        pack_cache(images, shards, resize=cfg.pack_resize, shard_size="8MB", progress=False)
    return shards


def train_command(pipeline: str, data: Path, cfg: DemoConfig, result: Path) -> list[str]:
    """The plain training script's command line for one pipeline."""
    workers = cfg.naive_workers if pipeline == "naive" else cfg.loader_workers()
    return [
        sys.executable, "-m", "gpufeed.demo.train", "--pipeline", pipeline,
        "--data", str(data), "--model", cfg.model, "--steps", str(cfg.steps),
        "--batch-size", str(cfg.batch_size), "--image-size", str(cfg.image_size),
        "--workers", str(workers), "--result", str(result),
    ]  # fmt: skip


def profile_training(
    pipeline: str,
    data: Path,
    cfg: DemoConfig,
    work: Path,
    on_step: Callable[[int], None] = lambda n: None,
) -> tuple[Path, dict[str, Any]]:
    """Run the training script under `gpufeed profile` as a real subprocess; (run dir, its figures)."""
    import re

    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    result, log = logs / f"{pipeline}.json", logs / f"{pipeline}.log"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "gpufeed.cli", "profile", "--out", str(work / "runs")]
    cmd += ["--name", pipeline, "--", *train_command(pipeline, data, cfg, result)]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step "):
                on_step(int(line.split()[1]))
        code = proc.wait()
    text = log.read_text(errors="replace")
    m = re.search(r"gpufeed: profiling into (.+)", text)
    if code != 0 or m is None or not result.is_file():
        tail = "\n".join(text.strip().splitlines()[-15:])
        killed = (
            " - it was killed, probably out of memory: use a smaller --image-size or --batch-size"
            if code in (-9, 128 + 9)  # SIGKILL, the kernel's answer when memory runs out
            else ""
        )
        raise DemoError(
            f"the {pipeline} training run failed (exit code {code}{killed}); its log is {log}:"
            f"\n{tail}"
        )
    return Path(m.group(1).strip()), json.loads(result.read_text())


def training_window_means(run: Run) -> tuple[float, float]:
    """(mean CPU busy %, mean GPU utilization % or NaN without GPU rows) over the training phase."""
    from gpufeed.analysis.stats import phases

    ph = phases(run).set_index("phase")
    sysdf = run.system
    if "training" in ph.index:
        t0, t1 = ph.loc["training", "start"], ph.loc["training", "end"]
        sysdf = sysdf[(sysdf["time"] >= t0) & (sysdf["time"] <= t1)]
    cpu = sysdf.loc[sysdf["metric"] == "cpu.util", "value"]
    gpu = sysdf.loc[sysdf["metric"] == "gpu.util", "value"]
    return (
        float(cpu.mean()) if len(cpu) else math.nan,
        float(gpu.mean()) if len(gpu) else math.nan,
    )


def steady_rate(run: Run, skip: int = 3) -> tuple[float, float]:
    """(images/s, data-wait share) from the profiler's steps after the first `skip` (worker
    start-up, first decode): all their samples over all their time, epoch starts included."""
    import numpy as np

    steps = run.steps.iloc[skip:]
    steps = steps[np.isfinite(steps["duration"].to_numpy(dtype=float))]
    total = float(steps["duration"].sum())
    if total <= 0:
        return math.nan, math.nan
    return float(steps["samples"].sum()) / total, float(steps["data_wait"].sum()) / total


def summarize(pipeline: str, run_dir: Path, figures: dict[str, Any]) -> PipelineResult:
    """Load the profiled run, run the rules, write its HTML report and collect the table's figures."""
    from gpufeed.analysis.api import analyze
    from gpufeed.analysis.run import load
    from gpufeed.commands.report import write_report

    run = load(run_dir)
    findings = analyze(run)
    report = write_report(run_dir, echo=lambda _: None)
    cpu, gpu = training_window_means(run)
    rate, wait = steady_rate(run)
    return PipelineResult(
        pipeline=pipeline,
        run_dir=run_dir,
        report=report,
        images_per_s=rate,
        wall_images_per_s=float(figures["images_per_s"]),
        data_wait_share=wait,
        cpu_util=cpu,
        gpu_util=gpu,
        steps=int(figures["steps"]),
        workers=int(figures["workers"]),
        findings=[f.to_dict() for f in findings],
    )


def run_demo(
    cfg: DemoConfig, work: str | os.PathLike[str] = DEFAULT_WORK_DIR, progress: bool = True
) -> DemoResult:
    """Run the whole demo in the work dir `work` (new, empty or the demo's own: see
    `claim_work_dir`) and return both runs (the result prints itself). With `progress`, what runs
    and its progress bars are shown on stderr; nothing is printed on stdout."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from gpufeed.hardware import describe, hardware

    console = Console(stderr=True, quiet=not progress)
    work = Path(work)
    claim_work_dir(work)
    (work / "demo-result.json").unlink(missing_ok=True)  # an earlier run's, were this one to fail
    hw = hardware()
    console.print(f"[bold]gpufeed demo[/] on {describe(hw)}")
    console.print(
        f"  {cfg.images} photo-like JPEGs (short side {cfg.short_side[0]}-{cfg.short_side[1]} px), "
        f"{cfg.model}, batch {cfg.batch_size}, {cfg.image_size}×{cfg.image_size} px, "
        f"{cfg.steps} steps per run; work dir {work}"
    )
    if not hw["gpus"]:
        console.print(
            "  [dim]No GPU: the model trains on one CPU core (standing in for the accelerator); "
            "the input pipeline gets the other cores.[/]"
        )
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bars:
        task = bars.add_task("photo-like images (generated once, then cached)", total=cfg.images)
        images = demo_images(work, cfg, on_images=lambda n, t=task: bars.update(t, completed=n))
        results = {}
        for pipeline in ("naive", "gpufeed"):
            if pipeline == "naive":
                data = images
                what = f"naive pipeline: Pillow full decode, num_workers={cfg.naive_workers}"
            else:
                task = bars.add_task(f"pack shards, pre-resized to {cfg.pack_resize} px", total=1)
                data = demo_shards(images, cfg)
                bars.update(task, completed=1)
                what = f"gpufeed loader: pre-resized shards, num_workers={cfg.loader_workers()}"
            task = bars.add_task(f"train, {what}", total=cfg.steps)
            run_dir, figures = profile_training(
                pipeline,
                data,
                cfg,
                work,
                on_step=lambda n, t=task: bars.update(t, completed=min(n, cfg.steps)),
            )
            results[pipeline] = summarize(pipeline, run_dir, figures)
    result = DemoResult(cfg, results["naive"], results["gpufeed"])
    (work / "demo-result.json").write_text(result.to_json() + "\n")
    return result


def _render(result: DemoResult) -> Group:
    """`DemoResult.__rich__`: the naive run's findings, the before/after table, the measured
    speedup, what to do next and where the reports are."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    from gpufeed.present.terminal import findings_view

    def pct(v: float) -> str:
        return "–" if math.isnan(v) else f"{v:.0f}%"

    table = Table(title="Before / after (measured)", title_justify="left")
    for col in ("pipeline", "images/s", "data wait", "CPU util", "GPU util", "workers"):
        table.add_column(col, justify="left" if col == "pipeline" else "right")
    for r in (result.naive, result.gpufeed):
        table.add_row(
            r.pipeline,
            f"{r.images_per_s:,.1f}",
            pct(100 * r.data_wait_share),
            pct(r.cpu_util),
            pct(r.gpu_util),
            str(r.workers),
        )
    color = "yellow" if result.after_input_bound else "green"
    return Group(
        findings_view(result.naive.findings, "Findings for the naive run"),
        "",
        table,
        f"[bold green]speedup ×{result.speedup:.2f}[/] "
        f"({result.gpufeed.images_per_s:,.1f} vs {result.naive.images_per_s:,.1f} images/s, "
        f"same model, batch, image size and {result.config.steps} steps)",
        "[dim]From the profiler: images/s and data wait over the steps after 3 warm-up steps, "
        "utilization over the training phase.[/]",
        f"[{color}]{escape(next_step(result))}[/]",
        _whole(f"reports: {result.naive.report}"),
        _whole(f"         {result.gpufeed.report}"),
    )


def _whole(line: str) -> Text:
    """`line` kept on one line, never wrapped at the console's width (80 columns in a pipe), so
    that a path in it can be copied whole."""
    from rich.text import Text

    return Text(line, no_wrap=True, overflow="ignore")
