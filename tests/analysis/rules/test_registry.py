"""The registry: every rule documented and tunable; run_rules orders by impact and checks overrides."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from rule_runs import RunBuilder, healthy

from gpufeed.analysis.rules import RULES, run_rules, settings
from gpufeed.analysis.rules.shared import CPU_SATURATION, INPUT_WAIT, STALL_PERIOD


def test_every_rule_has_an_id_a_docstring_documented_params_and_cpu_only_behaviour() -> None:
    assert len(RULES) >= 11
    for rid, rule in RULES.items():
        assert rule.id == rid and rule.summary() and rule.cpu_only
        for name, param in rule.all_params().items():
            assert param.doc, f"{rid}.{name} has no doc"
            # NVML's utilization.gpu is the share of time some kernel ran, not SM occupancy
            assert "SM utilization" not in param.doc, f"{rid}.{name}"


def test_findings_come_most_severe_first_then_by_speedup(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.07).process(1000, "main", 30.0)
    builder.process(2000, "worker", 99.0).metric("cpu.iowait", 30.0)
    findings = run_rules(builder.build())
    keys = [(f.severity, f.est_speedup) for f in findings]
    assert findings[0].rule == "DataLoaderBottleneck" and findings[0].severity == "critical"
    assert keys == sorted(
        keys, key=lambda k: (["info", "warning", "critical"].index(k[0]), k[1] or 1), reverse=True
    )
    assert {"CPUBottleneck", "IOBottleneck"} <= {f.rule for f in findings}


def test_a_rule_can_be_switched_off(builder: RunBuilder) -> None:
    run = builder.steps([0.1] * 100, waits=0.07).build()
    assert "DataLoaderBottleneck" not in {
        f.rule for f in run_rules(run, DataLoaderBottleneck={"enabled": "false"})
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"NoSuchRule": {"x": 1}}, "unknown rule 'NoSuchRule'"),
        ({"StepOutlier": {"thresh": 1}}, "unknown parameter StepOutlier.thresh"),
        ({"StepOutlier": {"k": "lots"}}, "StepOutlier.k: expected a number"),
        ({"warmup": {"steps": 2.5}}, "warmup.steps: expected a whole number"),
        ({"StepOutlier": {"enabled": "maybe"}}, "StepOutlier.enabled: expected true or false"),
        (  # a percent where a share is meant would silence the rule
            {"DataLoaderBottleneck": {"threshold": "10"}},
            "^DataLoaderBottleneck.threshold=10: expected a share 0–1 \\(0.1 = 10%\\)",
        ),
        ({"CPUBottleneck": {"wait_share": 50}}, "CPUBottleneck.wait_share=50: expected a share"),
    ],
)
def test_bad_overrides_are_named(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_rules(healthy(RunBuilder()).build(), **overrides)


def test_shares_take_0_to_1_and_percents_keep_their_scale() -> None:
    run = healthy(RunBuilder()).build()
    run_rules(run, DataLoaderBottleneck={"threshold": 1, "busy_worker_cpu": 95})
    shares = [f"{rid}.{n}" for rid, r in RULES.items() for n, p in r.params.items() if p.share]
    assert "BatchSize.mem_share" in shares and "CPUBottleneck.host_busy" not in shares


def test_settings_lists_the_warm_up_first() -> None:
    assert next(iter(settings())) == "warmup"


def test_runs_without_steps_or_samples_yield_nothing_rather_than_crash() -> None:
    assert run_rules(RunBuilder().build()) == []


def test_gpufeed_rules_lists_every_rule_with_its_parameters() -> None:
    import subprocess
    import sys

    cp = subprocess.run(
        [sys.executable, "-m", "gpufeed.cli", "rules"], capture_output=True, text=True
    )
    assert cp.returncode == 0, cp.stderr
    for rid in ["warmup", *RULES]:
        assert f"\n{rid}: " in cp.stdout
    assert "    threshold = 0.1  data-wait share of step time that triggers a warning" in cp.stdout


def test_shared_settings_are_the_parameters_of_the_rule_that_owns_them() -> None:
    for setting in (CPU_SATURATION, STALL_PERIOD, INPUT_WAIT):
        owner = RULES[setting.id].params
        assert all(owner.get(name) is p for name, p in setting.params.items()), setting.id


def test_no_rule_module_imports_another() -> None:
    """A rule reads another's parameters through `shared`, and derived facts through `context`,
    `periods` or `predict`: never from the other rule's module."""
    rule_modules = {type(rule).__module__ for rule in RULES.values()}
    for name in sorted(rule_modules):
        tree = ast.parse(Path(str(sys.modules[name].__file__)).read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not imported & (rule_modules - {name}), f"{name} imports {imported & rule_modules}"
