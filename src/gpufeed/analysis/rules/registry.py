"""The registry of built-in bottleneck rules and `run_rules`, which applies them to a run.

Each rule is a small class in its own module with an id, a docstring, and parameters with documented
defaults (`gpufeed rules` lists them). Parameters are overridden per call as
``run_rules(run, DataLoaderBottleneck={"threshold": 0.3}, warmup={"steps": 10})``, from the command
line with ``--set DataLoaderBottleneck.threshold=0.3`` or from ``gpufeed.toml`` (see analysis.config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.batch_size import BatchSize
from gpufeed.analysis.rules.context import WARMUP_ID, WARMUP_PARAMS, Context
from gpufeed.analysis.rules.cpu_bottleneck import CPUBottleneck
from gpufeed.analysis.rules.dataloader_bottleneck import DataLoaderBottleneck
from gpufeed.analysis.rules.initialization_time import MaxInitializationTime
from gpufeed.analysis.rules.io_bottleneck import IOBottleneck
from gpufeed.analysis.rules.load_balancing import LoadBalancing
from gpufeed.analysis.rules.low_gpu_utilization import LowGPUUtilization
from gpufeed.analysis.rules.memory_increase import GPUMemoryIncrease
from gpufeed.analysis.rules.mixed_precision import MixedPrecision
from gpufeed.analysis.rules.params import ConfigError, Param
from gpufeed.analysis.rules.periodic_stall import PeriodicStall
from gpufeed.analysis.rules.step_outlier import StepOutlier

if TYPE_CHECKING:
    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.run import Run

RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in (
        DataLoaderBottleneck(),
        CPUBottleneck(),
        IOBottleneck(),
        LowGPUUtilization(),
        BatchSize(),
        StepOutlier(),
        PeriodicStall(),
        GPUMemoryIncrease(),
        MaxInitializationTime(),
        LoadBalancing(),
        MixedPrecision(),
    )
}


def settings() -> dict[str, dict[str, Param]]:
    """Every overridable section (the warm-up, then each rule) with its parameters."""
    return {WARMUP_ID: WARMUP_PARAMS} | {rid: rule.all_params() for rid, rule in RULES.items()}


def describe() -> str:
    """Plain-text listing of every rule: id, what it detects, its CPU-only behaviour, its parameters."""
    lines = [
        "Override with --set RULE.param=value or a gpufeed.toml table [rules.RULE].",
        "",
        f"{WARMUP_ID}: steps skipped before the rules look at a run",
        *(f"    {name} = {_toml_value(p.default)}  {p.doc}" for name, p in WARMUP_PARAMS.items()),
    ]
    for rid, rule in RULES.items():
        lines += ["", f"{rid}: {rule.summary()}", f"    without GPU data: {rule.cpu_only}"]
        lines += [
            f"    {name} = {_toml_value(p.default)}  {p.doc}"
            for name, p in rule.all_params().items()
        ]
    return "\n".join(lines)


def _toml_value(value: float | int | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def validate(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Check and coerce overrides ({section: {param: value}}); unknown names raise ValueError naming them."""
    known = settings()
    out: dict[str, dict[str, Any]] = {}
    for section, values in overrides.items():
        if section not in known:
            raise ValueError(f"unknown rule {section!r}; known: {', '.join(known)}")
        if not isinstance(values, Mapping):
            raise ValueError(f"{section}: expected a table of parameters, got {values!r}")
        out[section] = {}
        for name, value in values.items():
            if name not in known[section]:
                raise ValueError(
                    f"unknown parameter {section}.{name}; {section} has: {', '.join(known[section])}"
                )
            out[section][name] = known[section][name].coerce(value, f"{section}.{name}")
    return out


def run_rules(run: Run, **overrides: Mapping[str, Any]) -> list[Finding]:
    """Apply every enabled rule to `run`; findings come most severe first, then by estimated
    speedup. A bad override is a `ConfigError` naming it."""
    checked = checked_overrides(overrides)
    return check_all(Context(run, checked.get(WARMUP_ID)), checked)


def checked_overrides(overrides: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """`overrides` validated (`validate`); a bad one is a `ConfigError` naming it and `where` it
    was given (a file, `--set`). The one place a `ValueError` of theirs becomes a `ConfigError`."""
    try:
        return validate(overrides)
    except ConfigError:
        raise
    except ValueError as exc:
        at = f"{where}: " if where else ""
        raise ConfigError(f"{at}{exc} (see `gpufeed rules`)") from None


def check_all(ctx: Context, checked: Mapping[str, Any]) -> list[Finding]:
    """Every enabled rule applied to `ctx` with the validated overrides `checked` (from
    `checked_overrides`), most severe first, then by estimated speedup."""
    ctx.params = {rid: rule.resolve(checked.get(rid)) for rid, rule in RULES.items()}
    findings: list[Finding] = []
    for rid, rule in RULES.items():
        params = ctx.params[rid]
        if params["enabled"]:
            findings.extend(rule.check(ctx, params))
    return sorted(findings, key=lambda f: f.impact_key(), reverse=True)
