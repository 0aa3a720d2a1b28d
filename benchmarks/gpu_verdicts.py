"""Issue 11 on a CUDA machine in one command: the suite, then `diagnose`, `tune` and `demo` on
real-photo-like JPEGs with RN-50 (bf16 autocast, channels_last: the CUDA defaults) held against what
training measures end to end, and the profiler's cost per step. Writes OUT/results.json, OUT/results.md
(verdict vs measured, hardware, durations; also printed) and OUT/log.txt (every command's output).

One device call (10-minute limit; gpufeed installed with `pip install --no-deps -e .`):

    PYTHONUNBUFFERED=1 python benchmarks/gpu_verdicts.py --out $OUT

Parts, in the order they run. `--only` picks some, and each call adds to OUT/results.json, so a
second call with `--only` fills in what a first one left. The durations below are estimates for one
H100 with 16 vCPU, made without a GPU; results.json records the measured ones:

    suite     python -m pytest -v -n 8 (summary line, failing test ids)     ~3-4 min, cut at 300 s
    data      8,192 JPEGs made and packed twice (gpu_feed.make_data)         ~60-90 s once, then 0
    overhead  recorder cost per batch/step with CUDA initialized, and without;
              sampler tick with NVML (profiler_overhead.py's functions)      ~30 s
    diagnose  its Python API (the CLI has no JSON output) on full-size shards ~40 s
    e2e       RN-50 on the Loader: under `gpufeed profile`, plain, and on synthetic batches
              (the ceiling); the profiled run's findings and `gpufeed show`; once more under
              `gpufeed profile --headspace 30` (its share of its own ceiling) ~140 s
    tune      `gpufeed tune --model resnet50 --batch-size 256 --out` + do its settings load  ~30-150 s
    demo      `gpufeed demo --model resnet50` (its demo-result.json)         ~90 s

`--variants full resized` adds diagnose and e2e on the shards pre-resized to 256 (~100 s). A part
is not started with less than 30 s of `--budget` (default 560 s) left: it is marked skipped, for a
later call with `--only`. On a CPU, `--smoke` runs every part at tiny sizes (ResNet-18, 48 images,
a small test file for the suite). That checks that the script works, not that the verdicts are right.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # the sibling benchmark scripts this one reuses

PARTS = ("suite", "data", "overhead", "diagnose", "e2e", "tune", "demo")
VARIANTS = ("full", "resized")  # full-size shards, shards pre-resized to 256 (gpu_feed.make_data)
INPUT_RULES = ("DataLoaderBottleneck", "CPUBottleneck", "IOBottleneck")  # rules that blame input
AGREE_WAIT = 0.05  # profiler and script data-wait shares this close (absolute) agree
AGREE_SHARE = 0.15  # diagnose's share of the ceiling this close to the measured one agrees
LEAST_S = 30  # a part starts only with this many seconds of the budget left


def sizes(smoke: bool) -> dict[str, Any]:
    """The workload: RN-50 at batch 256 on a GPU; ResNet-18 on tiny batches for --smoke."""
    if smoke:
        return {
            "images": 48, "model": "resnet18", "batch_size": 8, "image_size": 32, "steps": 8,
            "seconds": 0.5, "tune": ["--seconds", "0.5", "--repeats", "1"],
            "demo": ["--tiny", "--model", "resnet18", "--images", "256", "--steps", "8"],
            "suite": ["tests/test_errors.py"], "recorder_n": 5_000, "hook_n": 1_000,
            "headspace": 0,
        }  # fmt: skip
    return {
        "images": 8192, "model": "resnet50", "batch_size": 256, "image_size": 224, "steps": 200,
        "seconds": 4.0, "tune": [], "demo": ["--model", "resnet50"], "suite": ["tests"],
        "recorder_n": 50_000, "hook_n": 20_000, "headspace": 30,
    }  # fmt: skip


# --- running things -------------------------------------------------------------------------


class Log:
    """Every command's output, appended to OUT/log.txt under a header naming the command."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, title: str, text: str) -> None:
        with self.path.open("a") as f:
            f.write(f"\n===== {title} ({time.strftime('%H:%M:%S')}) =====\n{text}\n")


def run(cmd: list[str], timeout: float, log: Log, title: str) -> dict[str, Any]:
    """Run `cmd` from the repository root in its own process group (killed whole at `timeout`);
    its exit code, output, seconds and whether it timed out."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    seconds = time.perf_counter() - t
    log.add(f"{title}: {' '.join(cmd)} → exit {proc.returncode}, {seconds:.0f} s", out)
    return {"code": proc.returncode, "output": out, "seconds": seconds, "timed_out": timed_out}


def child(kind: str, cfg: dict[str, Any], timeout: float, log: Log) -> dict[str, Any]:
    """This script's `--child KIND CFG` in a fresh process (as the CLI would run): its RESULT."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(cfg)]
    done = run(cmd, timeout, log, f"child {kind}")
    found = [ln[7:] for ln in done["output"].splitlines() if ln.startswith("RESULT ")]
    if found:
        return {**json.loads(found[-1]), "seconds": done["seconds"]}
    return failure(done)


def failure(done: dict[str, Any]) -> dict[str, Any]:
    """What a failed command leaves in the results: why, and the end of its output."""
    why = "timed out" if done["timed_out"] else f"exit code {done['code']}"
    return {"error": f"{why}: {tail(done['output'], 1500)}", "seconds": done["seconds"]}


def tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "…" + text[-chars:]


# --- children: what runs in a fresh process ---------------------------------------------------


def child_diagnose(cfg: dict[str, Any]) -> dict[str, Any]:
    """`gpufeed diagnose` through its Python API (the CLI has no JSON output): its Diagnosis."""
    from rich.console import Console

    from gpufeed.advise.diagnose import diagnose

    result = diagnose(
        cfg["data"], model=cfg["model"], batch_size=cfg["batch_size"],
        image_size=cfg["image_size"], seconds=cfg["seconds"],
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=120, record=True)
    console.print(result)
    return {**result.to_dict(), "text": console.export_text()}


def child_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """The model on one resident synthetic batch with `gpufeed.demo.train`'s own loop and
    settings (fit; bf16 and channels_last on CUDA): the ceiling the Loader runs are held to."""
    import torch

    from gpufeed.devices import default_device
    from gpufeed.train.loop import SyntheticData, fit
    from gpufeed.train.resnet import resnet

    device = default_device()
    if device == "cpu":
        torch.set_num_threads(1)  # as gpufeed.demo.train trains on a CPU (its --threads default)
    data = SyntheticData(cfg["batch_size"], cfg["image_size"], cfg["classes"], cfg["steps"])
    result = fit(
        resnet(cfg["model"], num_classes=cfg["classes"]), data, steps=cfg["steps"],
        device=device, amp="bf16" if device == "cuda" else None,
        channels_last=device == "cuda", log_every=0, verbose=False,
    )  # fmt: skip
    return {"images_per_s": result.images_per_s, "device": device, "steps": result.steps}


def child_overhead(cfg: dict[str, Any]) -> dict[str, Any]:
    """profiler_overhead.py's per-event costs, in a process that has (or has not) initialized
    CUDA: with CUDA the recorder also records a CUDA event per step."""
    import torch
    from profiler_overhead import flush_cost, forward_hook_cost, recorder_cost, sampler_cost

    if cfg["cuda"]:
        torch.zeros(1, device="cuda")
    per_batch, per_step = recorder_cost(cfg["recorder_n"])
    return {
        "cuda_initialized": torch.cuda.is_initialized(),
        "us_per_batch": per_batch,
        "us_per_step": per_step,
        "us_model_hooks": forward_hook_cost(cfg["hook_n"]),
        "ms_per_flush_200_steps": flush_cost(),
        "ms_per_sampler_tick": sampler_cost(),
    }


def child_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """Does `Loader(data, **load_settings(tune's file))` build and deliver a batch?"""
    from gpufeed.data import Loader, load_settings

    settings = load_settings(cfg["settings"])
    loader = Loader(cfg["data"], **settings)
    try:
        images = next(iter(loader))[0]
    finally:
        loader.close()
    return {"settings": settings, "batch_shape": list(images.shape)}


CHILDREN = {
    "diagnose": child_diagnose,
    "ceiling": child_ceiling,
    "overhead": child_overhead,
    "settings": child_settings,
}


# --- the parts --------------------------------------------------------------------------------


def part_data(ctx: dict[str, Any]) -> dict[str, Any]:
    """The real-photo-like JPEGs and their two packings, exactly as gpu_feed.py makes them."""
    from gpu_feed import make_data

    t = time.perf_counter()
    root, full, small = make_data(ctx["cache"], ctx["sizes"]["images"], 80)
    files = list(root.glob("*/*.jpg"))
    ctx["data"] = {"images": root, "full": full, "resized": small}
    return {
        "images": len(files),
        "mean_kib": sum(f.stat().st_size for f in files) / max(1, len(files)) / 1024,
        "folders": {k: str(v) for k, v in ctx["data"].items()},
        "seconds": time.perf_counter() - t,
    }


def part_overhead(ctx: dict[str, Any]) -> dict[str, Any]:
    """Recording costs with CUDA initialized (the case the issue measured at 50.5 µs) and without."""
    s = ctx["sizes"]
    cfg = {"recorder_n": s["recorder_n"], "hook_n": s["hook_n"]}
    out = {}
    for name, cuda in (("cuda", True), ("cpu", False)):
        if cuda and not ctx["cuda"]:
            continue
        out[name] = child("overhead", {**cfg, "cuda": cuda}, ctx["left"](), ctx["log"])
    return out


def part_diagnose(ctx: dict[str, Any]) -> dict[str, Any]:
    s = ctx["sizes"]
    out = {}
    for v in ctx["variants"]:
        cfg = {"data": str(ctx["data"][v]), **{k: s[k] for k in ("model", "batch_size")}}
        cfg |= {"image_size": s["image_size"], "seconds": s["seconds"]}
        out[v] = child("diagnose", cfg, ctx["left"](), ctx["log"])
    return out


def train_cmd(ctx: dict[str, Any], shards: Path, result: Path) -> list[str]:
    """gpufeed's plain training script on the Loader, set up as `diagnose` assumes the job is:
    the Loader's default workers, CPU preprocessing, the naive recipe (load factor 1)."""
    from gpufeed.data.loader import default_workers

    s = ctx["sizes"]
    return [
        sys.executable, "-m", "gpufeed.demo.train", "--pipeline", "gpufeed", "--data", str(shards),
        "--model", s["model"], "--steps", str(s["steps"]), "--batch-size", str(s["batch_size"]),
        "--image-size", str(s["image_size"]), "--workers", str(default_workers()),
        "--preprocess", "cpu", "--result", str(result),
    ]  # fmt: skip


def profiled_run(run_dir: Path) -> dict[str, Any]:
    """What the profiler made of a run: its steady rate and data wait, CPU/GPU busy and the
    findings (top rule first)."""
    import gpufeed
    from gpufeed.demo.compare import steady_rate, training_window_means

    run = gpufeed.load(run_dir)
    rate, wait = steady_rate(run)
    cpu, gpu = training_window_means(run)
    findings = [f.to_dict() for f in gpufeed.analyze(run)]
    keep = ("rule", "severity", "title", "est_speedup", "recommendation")
    return {
        "run_dir": str(run_dir),
        "images_per_s": rate,
        "data_wait_share": wait,
        "cpu_util": cpu,
        "gpu_util": gpu,
        "top_rule": findings[0]["rule"] if findings else None,
        "findings": [{k: f.get(k) for k in keep} for f in findings],
    }


def headspace_share(run_dir: Path) -> dict[str, Any]:
    """The job's share of its own ceiling as `gpufeed profile --headspace` measured it."""
    import gpufeed
    from gpufeed.analysis.rules.context import Context

    ceiling = Context(gpufeed.load(run_dir)).ceiling
    if ceiling is None:
        return {"error": "no ceiling measured"}
    return {
        "share": ceiling.share,
        "ceiling_step_s": ceiling.ceiling_step,
        "real_step_s": ceiling.real_step,
    }


def part_e2e(ctx: dict[str, Any]) -> dict[str, Any]:
    """The measured truth: the Loader run under `gpufeed profile` and plain, and the ceiling."""
    s, log, work = ctx["sizes"], ctx["log"], ctx["work"]
    cfg = {k: s[k] for k in ("model", "batch_size", "image_size", "steps")}
    out: dict[str, Any] = {"ceiling": child("ceiling", {**cfg, "classes": 100}, ctx["left"](), log)}
    for v in ctx["variants"]:
        res: dict[str, Any] = {}
        # "headspace": profiled again with --headspace (its own rate includes replayed steps)
        for mode in ("profiled", "plain", "headspace")[: 3 if s["headspace"] else 2]:
            figures = work / f"e2e-{v}-{mode}.json"
            figures.unlink(missing_ok=True)
            cmd = train_cmd(ctx, ctx["data"][v], figures)
            if mode != "plain":
                prefix = ["-m", "gpufeed.cli", "profile", "--out", str(work / "runs")]
                if mode == "headspace":
                    prefix += ["--headspace", str(s["headspace"])]
                cmd = [sys.executable, *prefix, "--name", f"e2e-{v}-{mode}", "--", *cmd]
            done = run(cmd, ctx["left"](), log, f"e2e {v} {mode}")
            if done["code"] != 0 or not figures.is_file():
                res[mode] = failure(done)
                continue
            res[mode] = {**json.loads(figures.read_text()), "seconds": done["seconds"]}
            m = re.search(r"gpufeed: profiling into (.+)", done["output"])
            if mode == "headspace" and m:
                try:
                    res["headspace_share"] = headspace_share(Path(m.group(1).strip()))
                except Exception as e:
                    res["headspace_share"] = {"error": f"{type(e).__name__}: {e}"}
            if mode == "profiled" and m:
                run_dir = Path(m.group(1).strip())
                try:
                    res["profiler"] = profiled_run(run_dir)
                except Exception as e:  # a run the analysis cannot read is a result too
                    log.add(f"analysis of {run_dir} failed", traceback.format_exc())
                    res["profiler"] = {"error": f"{type(e).__name__}: {e}"}
                shown = run(
                    [sys.executable, "-m", "gpufeed.cli", "show", str(run_dir)],
                    ctx["left"](), log, f"show e2e {v}",
                )  # fmt: skip
                res["show"] = tail(shown["output"], 6000)
        out[v] = res
    return out


def part_tune(ctx: dict[str, Any]) -> dict[str, Any]:
    """`gpufeed tune` on the full-size shards, its JSON, and whether its settings load."""
    s, work = ctx["sizes"], ctx["work"]
    target = work / "tune.json"
    target.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "gpufeed.cli", "tune", "--data", str(ctx["data"]["full"]),
        "--model", s["model"], "--batch-size", str(s["batch_size"]),
        "--image-size", str(s["image_size"]), "--out", str(target), *s["tune"],
    ]  # fmt: skip
    done = run(cmd, ctx["left"](), ctx["log"], "tune")
    if done["code"] != 0 or not target.is_file():
        return failure(done)
    result = {**json.loads(target.read_text()), "seconds": done["seconds"]}
    result["text"] = tail(done["output"], 6000)  # skipped trials are noted here, not in the JSON
    load = {"settings": str(target), "data": str(ctx["data"]["full"])}
    result["settings_load"] = child("settings", load, ctx["left"](), ctx["log"])
    return result


def part_demo(ctx: dict[str, Any]) -> dict[str, Any]:
    """`gpufeed demo`, its demo-result.json and the after run's own data-wait figure."""
    work = ctx["work"] / "demo"
    result_file = work / "demo-result.json"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "gpufeed.cli", "demo", "--out", str(work), *ctx["sizes"]["demo"]]
    done = run(cmd, ctx["left"](), ctx["log"], "demo")
    if done["code"] != 0 or not result_file.is_file():
        return failure(done)
    result = {**json.loads(result_file.read_text()), "seconds": done["seconds"]}
    figures = work / "logs" / "gpufeed.json"  # the after run's training script's own figures
    if figures.is_file():
        result["after_script"] = json.loads(figures.read_text())
    return result


def part_suite(ctx: dict[str, Any]) -> dict[str, Any]:
    """The test suite (on 8 xdist workers where pytest-xdist is installed): summary, failing ids.
    Verbose, so that a run cut short by the budget still names the tests that failed so far."""
    import importlib.util

    args = ctx["suite_args"] or ctx["sizes"]["suite"]
    parallel = ["-n", "8"] if importlib.util.find_spec("xdist") and not ctx["smoke"] else []
    cmd = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", *parallel]
    cmd += [
        "--continue-on-collection-errors",
        *args,
    ]  # a test module missing a package is one error
    done = run(cmd, min(ctx["suite_timeout"], ctx["left"]()), ctx["log"], "suite")
    return {
        **suite_summary(done["output"]),
        "command": " ".join(["python", *cmd[1:]]),
        "code": done["code"],
        "timed_out": done["timed_out"],
        "seconds": done["seconds"],
    }


def suite_summary(output: str) -> dict[str, Any]:
    """pytest's closing line ("3 failed, 10 passed in 4.2s") and the ids of failed/errored tests."""
    lines = [ln.strip("= ") for ln in output.splitlines() if ln.strip()]
    closing = [ln for ln in lines if re.search(r"\b(passed|failed|errors?|skipped)\b.* in ", ln)]
    failed: dict[str, None] = {}  # ordered, without repeats (progress line, then the -rfE summary)
    for ln in output.splitlines():
        ids = re.findall(r"(\S+\.py::\S+)", ln)
        if ids and re.search(r"\b(FAILED|ERROR)\b", ln):
            failed[ids[0]] = None
    return {"summary": closing[-1] if closing else None, "failed": list(failed)}


PART_FUNCS = {
    "data": part_data,
    "overhead": part_overhead,
    "diagnose": part_diagnose,
    "e2e": part_e2e,
    "tune": part_tune,
    "demo": part_demo,
    "suite": part_suite,
}


# --- the verdict table ------------------------------------------------------------------------


def pct(x: Any) -> str:
    return f"{x:.0%}" if isinstance(x, int | float) and math.isfinite(x) else "–"


def num(x: Any, fmt: str = ",.0f") -> str:
    return format(x, fmt) if isinstance(x, int | float) and math.isfinite(x) else "–"


def agree(a: bool | None, b: bool | None) -> str:
    return "–" if a is None or b is None else ("yes" if a == b else "**NO**")


Row = tuple[str, str, str, str]  # check, what gpufeed says, what was measured, agrees?


def rows(parts: dict[str, Any]) -> list[Row]:
    """The table: a row per verdict of every part that ran, next to what was measured."""
    out = [
        (part, "failed: " + result["error"][:160], "", "**NO**")
        for part, result in parts.items()
        if isinstance(result, dict) and "error" in result and part not in ("tune", "demo", "suite")
    ]
    for v in VARIANTS:
        out += verdict_rows(parts, v)
    out += tune_rows(parts.get("tune"), parts.get("e2e", {}))
    out += demo_rows(parts.get("demo"))
    overhead = parts.get("overhead") or {}
    out += overhead_rows({} if "error" in overhead else overhead)
    out += suite_rows(parts.get("suite"))
    return out


def verdict_rows(parts: dict[str, Any], v: str) -> list[Row]:
    """diagnose's verdict and the profiler's (top rule, data wait) on `v` shards against the
    training script's own meters and the synthetic ceiling; the profiler's end-to-end cost."""
    from gpufeed.advise.diagnose import WAITING

    out: list[Row] = []
    e2e = parts.get("e2e", {})
    ceiling = (e2e.get("ceiling") or {}).get("images_per_s")
    d = (parts.get("diagnose") or {}).get(v)
    run_ = e2e.get(v) or {}
    plain = run_.get("plain") or run_.get("profiled") or {}
    wait, rate = plain.get("data_wait_fraction"), plain.get("images_per_s")
    share = rate / ceiling if rate and ceiling else None
    bound = wait >= WAITING if isinstance(wait, float) else None
    truth = f"{num(rate)} img/s = {num(share, '.2f')} of the ceiling, data wait {pct(wait)}"
    if d and "error" in d:
        out.append((f"diagnose, {v} shards", "failed: " + d["error"][:80], truth, "**NO**"))
    elif d:
        said = (
            f"{d['verdict']}, {d['ceiling_share']:.2f} of the ceiling "
            f"({num(d['together_images_per_s'])} img/s together), "
            f"wait {pct(d['together_data_wait_share'])}"
        )
        ok = agree(d["verdict"] == "input-bound", bound)
        if share is not None and abs(d["ceiling_share"] - share) > AGREE_SHARE:
            ok += f" (share off by {abs(d['ceiling_share'] - share):.2f})"
        out.append((f"diagnose, {v} shards", said, truth, ok))
    prof = run_.get("profiler")
    if prof and "error" in prof:
        out.append(
            (f"profile + analyze, {v} shards", "failed: " + prof["error"][:160], truth, "**NO**")
        )
    elif prof:
        top = prof["top_rule"] or "no finding"
        said = f"top rule {top}; data wait {pct(prof['data_wait_share'])}, GPU {num(prof['gpu_util'])}% busy"
        ok = agree(top in INPUT_RULES, bound)
        if isinstance(wait, float) and abs(prof["data_wait_share"] - wait) > AGREE_WAIT:
            ok += f" (data wait off by {abs(prof['data_wait_share'] - wait):.0%})"
        out.append((f"profile + analyze, {v} shards", said, truth, ok))
    own = run_.get("headspace_share")
    if own:
        said = (
            "failed: " + own["error"]
            if "error" in own
            else f"{own['share']:.2f} of its own ceiling"
        )
        ok = (
            "**NO**"
            if "error" in own or share is None
            else agree(True, abs(own["share"] - share) <= AGREE_SHARE)
        )
        out.append((f"profile --headspace, {v} shards", said, truth, ok))
    profiled = run_.get("profiled") or {}
    if run_.get("plain") and profiled.get("images_per_s") and rate:
        ratio = profiled["images_per_s"] / rate
        said = f"profiled {num(profiled['images_per_s'])} img/s"
        out.append(
            (
                f"profiler cost end to end, {v} (one pair)",
                said,
                f"plain {num(rate)}: ×{ratio:.3f}",
                "–",
            )
        )
    return out


def tune_rows(t: dict[str, Any] | None, e2e: dict[str, Any]) -> list[Row]:
    """tune's winner, whether it stopped early, and whether its settings file loads."""
    if not t:
        return []
    if "error" in t:
        return [("tune, full-size shards", "failed: " + t["error"][:80], "", "**NO**")]
    best = max(t["trials"], key=lambda x: x["images_per_s"])
    said = (
        f"best {best['num_workers']} workers, prefetch {best['prefetch']}, {best['preprocess']}: "
        f"{num(best['images_per_s'])} img/s end to end (±{pct(best['spread'] / 2)}), wait "
        f"{pct(best['data_wait_share'])}; "
        + ("stopped early" if t["stopped_early"] else "still input-bound")
    )
    loads = t.get("settings_load") or {}
    ok = "batch_shape" in loads
    truth = "its settings load: " + ("yes" if ok else loads.get("error", "?")[:80])
    full = (e2e.get("full") or {}).get("plain") or {}
    if full.get("images_per_s"):
        truth += f"; e2e with the Loader's defaults {num(full['images_per_s'])} img/s"
    return [("tune, full-size shards", said, truth, "yes" if ok else "**NO**")]


def demo_rows(dm: dict[str, Any] | None) -> list[Row]:
    """demo's word on its after run against that training script's own data wait."""
    from gpufeed.demo.compare import STILL_WAITING

    if not dm:
        return []
    if "error" in dm:
        return [("demo", "failed: " + dm["error"][:80], "", "**NO**")]
    after = dm["gpufeed"]
    said = (
        f"after run {'still input-bound' if dm['after_input_bound'] else 'not input-bound'} "
        f"(wait {pct(after['data_wait_share'])}, GPU {num(after['gpu_util'])}%); "
        f"speedup ×{dm['speedup']:.2f}"
    )
    own = (dm.get("after_script") or {}).get("data_wait_fraction")
    bound = own >= STILL_WAITING if isinstance(own, float) else None
    return [
        (
            "demo",
            said,
            f"the after script's own data wait {pct(own)}",
            agree(dm["after_input_bound"], bound),
        )
    ]


def overhead_rows(parts: dict[str, Any]) -> list[Row]:
    """Recording costs; the suite's bound (tests/profiler/test_steps.py) is 50 µs per event."""
    out: list[Row] = []
    for name, o in parts.items():
        if "error" in o:
            out.append((f"recording cost ({name})", "failed: " + o["error"][:80], "", "**NO**"))
            continue
        said = f"{o['us_per_step']:.1f} µs per step, {o['us_per_batch']:.1f} µs per batch"
        truth = f"model hooks {o['us_model_hooks']:.1f} µs/step; sampler {o['ms_per_sampler_tick']:.1f} ms/tick"
        ok = "yes" if max(o["us_per_step"], o["us_per_batch"]) < 50 else "**NO**"
        out.append((f"recording cost ({name})", said, truth, ok))
    return out


def suite_rows(su: dict[str, Any] | None) -> list[Row]:
    if not su:
        return []
    if "error" in su:
        return [("test suite", "failed: " + su["error"][:160], "", "**NO**")]
    said = su.get("summary") or ("timed out" if su.get("timed_out") else f"exit {su.get('code')}")
    failed = ", ".join(su.get("failed") or []) or "none"
    return [("test suite", said, f"failing: {failed}", "yes" if su.get("code") == 0 else "**NO**")]


def render(doc: dict[str, Any]) -> str:
    """results.md: hardware, the verdict-vs-measured table and each part's duration."""
    from gpufeed.advise.diagnose import WAITING

    hw = doc["hardware"]
    lines = [
        f"# Issue 11 verdicts vs measured ({doc['updated']})",
        "",
        f"Hardware: {hw.get('gpu') or 'no GPU'} (driver {hw.get('driver') or '–'}), "
        f"{hw['cpu_count']} CPUs ({hw['usable_cores']} usable, {hw['cpu_model']}), "
        f"torch {hw['torch']} (CUDA {hw.get('cuda') or '–'}). "
        f"Workload: {doc['sizes']['model']}, batch {doc['sizes']['batch_size']}, "
        f"{doc['sizes']['image_size']} px, {doc['sizes']['images']} JPEGs"
        + (" (--smoke)" if doc.get("smoke") else "")
        + ". Measured = `gpufeed.demo.train` on the Loader (its own meters, the plain run); "
        "ceiling = the same loop on one resident synthetic batch. Agrees: the verdict matches the "
        f"measured one (input-bound when the script waits for data {WAITING:.0%} of its time or "
        "more); a note "
        f"when a share of the ceiling is off by over {AGREE_SHARE} or a data wait by over "
        f"{AGREE_WAIT:.0%}; recording costs under the suite's 50 µs bound.",
        "",
        "| check | gpufeed says | measured | agrees |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(doc["parts"])]
    lines += ["", "Durations: " + ", ".join(
        f"{k} {v['seconds']:.0f} s" for k, v in doc["durations"].items() if "seconds" in v
    )]  # fmt: skip
    skipped = {k: v["skipped"] for k, v in doc["durations"].items() if "skipped" in v}
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())]
    return "\n".join(lines) + "\n"


def hardware() -> dict[str, Any]:
    """GPU name and driver, CPU count, torch and CUDA versions."""
    import torch

    from gpufeed.hardware import hardware as machine

    m = machine()
    hw = {
        "cpu_count": os.cpu_count(), "usable_cores": m["cpu_cores"], "cpu_model": m["cpu_model"],
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": ", ".join(g["name"] for g in m["gpus"]) or None, "driver": None,
    }  # fmt: skip
    try:
        import pynvml

        pynvml.nvmlInit()
        hw["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no NVIDIA driver: the row says so
        pass
    return hw


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run the chosen parts, write and print the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--out", type=Path, required=False, help="where results.json/.md and log.txt go"
    )
    ap.add_argument(
        "--only", nargs="+", choices=PARTS, help="run only these parts (data is implied)"
    )
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/gpu-bench"),
                    help="data set and work files, reused across calls (gpu_feed.py's default)")  # fmt: skip
    ap.add_argument("--budget", type=float, default=560, help="seconds; later parts are skipped")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS,
                    help="shards for diagnose and e2e (default: full; both add ~100 s)")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU, ResNet-18")
    ap.add_argument("--suite-args", nargs="+", help="what pytest runs (default: tests)")
    ap.add_argument("--suite-timeout", type=float, default=300, help="seconds the suite may take")
    args = ap.parse_args(argv)
    start = time.monotonic()
    if args.child:
        kind, cfg = args.child
        print("RESULT " + json.dumps(CHILDREN[kind](json.loads(cfg))), flush=True)
        return
    if args.out is None:
        ap.error("--out DIR is required: where results.json, results.md and log.txt go")
    if args.budget <= 0:
        ap.error(f"--budget {args.budget:g}: give the seconds the whole run may take, e.g. 560")
    for opt, path in (("--out", args.out), ("--cache", args.cache)):
        if path.exists() and not path.is_dir():
            ap.error(f"{opt} {path} is a file: give a folder")
    args.out, args.cache = args.out.resolve(), args.cache.resolve()  # children run from the root
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        sys.exit("gpu_verdicts.py: no CUDA GPU here; on a CPU run it with --smoke (tiny sizes)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.cache / ("verdicts-smoke" if args.smoke else "verdicts")
    ctx: dict[str, Any] = {
        "cache": args.cache, "work": work.resolve(), "sizes": sizes(args.smoke), "cuda": cuda,
        "smoke": args.smoke, "suite_args": args.suite_args, "suite_timeout": args.suite_timeout,
        "variants": args.variants or ["full"], "log": Log(args.out / "log.txt"),
        "left": lambda: args.budget - (time.monotonic() - start),
    }  # fmt: skip
    results_file = args.out / "results.json"
    doc = json.loads(results_file.read_text()) if results_file.is_file() else {}
    if doc.get("smoke", args.smoke) != args.smoke:
        doc = {}  # never mix --smoke figures with real ones
    doc.setdefault("parts", {})
    doc.setdefault("durations", {})
    doc |= {"hardware": hardware(), "sizes": ctx["sizes"], "smoke": args.smoke}
    wanted = set(args.only or PARTS)
    if wanted - {"suite"}:
        wanted.add("data")  # every part but the suite runs on the data set
    chosen = [p for p in PARTS if p in wanted]
    if "data" in chosen:
        work.mkdir(parents=True, exist_ok=True)
    for part in chosen:
        if ctx["left"]() < LEAST_S:
            doc["durations"][part] = {
                "skipped": f"--budget {args.budget:g} s spent; run --only {part}"
            }
            print(f"{part}: skipped (budget spent)", flush=True)
            continue
        print(f"{part}: running …", flush=True)
        t = time.perf_counter()
        try:
            doc["parts"][part] = PART_FUNCS[part](ctx)
        except Exception as e:  # one part's failure is a result; the other parts still run
            ctx["log"].add(f"{part} failed", traceback.format_exc())
            doc["parts"][part] = {"error": f"{type(e).__name__}: {e} (traceback in log.txt)"}
        doc["durations"][part] = {"seconds": time.perf_counter() - t}
        doc["updated"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"{part}: done in {doc['durations'][part]['seconds']:.0f} s", flush=True)
        results_file.write_text(json.dumps(doc, indent=1, default=str) + "\n")  # as it goes
        (args.out / "results.md").write_text(render(doc))
    doc["updated"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results_file.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    text = render(doc)
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
