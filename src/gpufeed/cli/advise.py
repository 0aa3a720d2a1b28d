"""The commands that measure: `bench` (an experiment of `bench/`), `demo` (a naive pipeline
profiled, then fixed), `diagnose` (input- or compute-bound?) and `tune` (the loader's settings by
trials); each checks its options, calls one function and prints what it returns."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufeed.advise.diagnose import diagnose
from gpufeed.advise.tune import tune
from gpufeed.cli.options import (
    AUGMENT_LOAD_HELP,
    MOST_AUGMENT_LOAD,
    check_count,
    check_seconds,
    check_utf8,
    default,
    echo_result,
    onto_stdout,
    written,
)
from gpufeed.demo.compare import DEFAULT_WORK_DIR, GPU_IMAGE_SIZE, DemoConfig
from gpufeed.errors import GpufeedError
from gpufeed.output_paths import check_output_dir, check_output_file
from gpufeed.text import visible


def bench_cmd(
    name: Annotated[
        str,
        typer.Argument(
            help="augload (CPU vs GPU preprocessing × augmentation load × model), "
            "workers (1 vs cores-1 loader workers, resized vs not), batch (small vs large batch).",
        ),
    ],
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="Results directory (default ./gpufeed-runs/bench-NAME)."),
    ] = None,
    full: Annotated[
        bool | None,
        typer.Option(
            "--full/--reduced",
            help="Full GPU grid or the reduced CPU grid (default: full iff CUDA).",
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data", help="Your image folder (class/image.jpg) instead of the generated one."
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option("--budget", help="Stop starting new configurations after this many seconds."),
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Steps per configuration.")] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats", help="augload: interleaved repeats of the grid (medians reported)."
        ),
    ] = None,
    images: Annotated[int | None, typer.Option("--images", help="Images to generate.")] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Batch size (augload, workers).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Loader workers, 1 or more (default cores-1); for `workers` the count "
            "compared with 1 worker, 2 or more.",
        ),
    ] = None,
    cache: Annotated[
        str | None,
        typer.Option(
            "--cache",
            help="Where generated images and shards are kept (./.gpufeed-cache/bench).",
        ),
    ] = None,
) -> None:
    """Run an experiment; write results.csv/.json/.md and results.png with the hardware.

    Experiments: augload, workers, batch. Partial results are written after every configuration.
    """
    import warnings

    from gpufeed.bench.experiments import run_bench

    check_seconds("--budget", budget)
    for option, value in (("--steps", steps), ("--repeats", repeats), ("--images", images)):
        check_count(option, value, 1)
    check_count("--batch-size", batch_size, 1)
    check_count("--workers", workers, 1)  # as `default_config` requires

    with warnings.catch_warnings(record=True) as caught:  # e.g. files of --data skipped, no chart
        path = run_bench(
            name, out, full=full, data=data, budget_s=budget, steps=steps, repeats=repeats,
            images=images, batch_size=batch_size, workers=workers, cache=cache,
        )  # fmt: skip
    # not Python's own notices (3.12 warns of os.fork beside threads, as for any DataLoader)
    ours = (w for w in caught if not issubclass(w.category, DeprecationWarning))
    for message in dict.fromkeys(str(w.message) for w in ours):
        typer.secho(f"gpufeed: warning: {visible(message)}", err=True, fg=typer.colors.YELLOW)
    chart = ", .png" if (path / "results.png").is_file() else ""
    typer.echo(f"gpufeed: wrote {visible(path)}/results.md (+ .csv, .json{chart})")


DEMO = DemoConfig()


def demo_cmd(
    tiny: Annotated[
        bool, typer.Option("--tiny", help="A few hundred images, seconds (what CI runs).")
    ] = False,
    images: Annotated[
        int | None,
        typer.Option("--images", help=f"Images to generate (default {DEMO.images})."),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", help=f"Training steps per run (default {DEMO.steps})."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help=f"{DEMO.model} (default), resnet50, ..."),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help=f"Batch size (default {DEMO.batch_size})."),
    ] = None,
    image_size: Annotated[
        int | None,
        typer.Option(
            "--image-size",
            help=f"Training image size (default {DEMO.image_size} on CPU, {GPU_IMAGE_SIZE} with a GPU).",
        ),
    ] = None,
    out: Annotated[
        str, typer.Option("--out", "-o", help="Work dir; data is cached here.")
    ] = DEFAULT_WORK_DIR,
) -> None:
    """Profile a naive training pipeline, show its bottleneck, then fix it with the gpufeed loader."""
    from gpufeed.demo.compare import demo_config, run_demo

    check_utf8("--out", out)
    check_output_dir("--out", out)
    echo_result(run_demo(demo_config(tiny, images, steps, model, batch_size, image_size), out))


def diagnose_cmd(
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Image folder, shard directory, or module:function returning a loader.",
        ),
    ],
    model: Annotated[
        str, typer.Option("--model", help="resnet18, resnet50, resnet152 or module:function.")
    ] = default(diagnose, "model"),
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Batch size (folder and shards).")
    ] = default(diagnose, "batch_size"),
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda (default: cuda if any).")
    ] = default(diagnose, "device"),
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Loader workers for a folder or shards (default: on CUDA every core but one, "
            "as the Loader; on a CPU device half the cores, which also train).",
        ),
    ] = default(diagnose, "workers"),
    image_size: Annotated[int, typer.Option("--image-size", help="Training image size.")] = default(
        diagnose, "image_size"
    ),
    seconds: Annotated[float, typer.Option("--seconds", help="Seconds per measurement.")] = default(
        diagnose, "seconds"
    ),
    precision: Annotated[
        str,
        typer.Option(
            "--precision", help="bf16, fp16 or fp32 autocast (default: bf16 on CUDA, else fp32)."
        ),
    ] = default(diagnose, "precision"),
    channels_last: Annotated[
        bool | None,
        typer.Option(
            "--channels-last/--no-channels-last", help="Memory format (default: on with CUDA)."
        ),
    ] = default(diagnose, "channels_last"),
    compile: Annotated[
        bool, typer.Option("--compile", help="torch.compile the model, as the job does.")
    ] = default(diagnose, "compile"),
    augment_load: Annotated[
        int,
        typer.Option("--augment-load", help=AUGMENT_LOAD_HELP + " Folder and shards only."),
    ] = default(diagnose, "augment_load"),
    json_out: Annotated[
        str | None,
        typer.Option("--json", help="Also write the diagnosis as JSON to this file (for CI)."),
    ] = None,
) -> None:
    """Input-bound or compute-bound? Measure the loader alone, the model alone and both together."""
    check_seconds("--seconds", seconds)
    check_count("--workers", workers, 0)
    check_count("--batch-size", batch_size, 1)
    check_count("--image-size", image_size, 1)
    check_count("--augment-load", augment_load, 0, MOST_AUGMENT_LOAD)
    check_output_file("--json", json_out)

    result = diagnose(
        data,
        model,
        batch_size,
        device,
        workers,
        image_size,
        seconds,
        precision=precision,
        channels_last=channels_last,
        compile=compile,
        augment_load=augment_load,
    )
    echo_result(result, onto_stdout(json_out))
    if json_out:
        from gpufeed.atomic import write_atomic
        from gpufeed.present.html import strict_json

        try:
            write_atomic(json_out, strict_json(result.to_dict(), indent=2) + "\n")
        except OSError as e:
            raise GpufeedError(f"cannot write {written(e, json_out)}: {e.strerror}") from None


def tune_cmd(
    data: Annotated[str, typer.Option("--data", help="Shard directory (or an image folder).")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Stop once the loader outruns this model (name or module:function)."
        ),
    ] = default(tune, "model"),
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size.")] = default(
        tune, "batch_size"
    ),
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda (default: cuda if any).")
    ] = default(tune, "device"),
    image_size: Annotated[int, typer.Option("--image-size", help="Training image size.")] = default(
        tune, "image_size"
    ),
    allow_batch_change: Annotated[
        bool,
        typer.Option("--allow-batch-change", help="Also try half and double the batch size."),
    ] = default(tune, "allow_batch_change"),
    out: Annotated[str, typer.Option("--out", "-o", help="Where to write the winner.")] = default(
        tune, "out"
    ),
    seconds: Annotated[float, typer.Option("--seconds", help="Seconds per measurement.")] = default(
        tune, "seconds"
    ),
    repeats: Annotated[
        int, typer.Option("--repeats", help="Measurements per trial (median, spread).")
    ] = default(tune, "repeats"),
    augment_load: Annotated[int, typer.Option("--augment-load", help=AUGMENT_LOAD_HELP)] = default(
        tune, "augment_load"
    ),
) -> None:
    """Search loader workers, prefetch, CPU/GPU preprocessing (and batch size) by measured trials."""
    check_seconds("--seconds", seconds)
    check_count("--batch-size", batch_size, 1)
    check_count("--image-size", image_size, 1)
    check_count("--augment-load", augment_load, 0, MOST_AUGMENT_LOAD)
    check_output_file("--out", out, example="gpufeed-tune.json")

    result = tune(
        data,
        model,
        batch_size,
        device,
        image_size,
        allow_batch_change,
        out,
        seconds,
        repeats=repeats,
        augment_load=augment_load,
    )
    echo_result(result, onto_stdout(out))
