"""Finding: checked severity and speedup, JSON-ready dict, impact ordering."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpufeed.analysis.finding import Finding


def test_to_dict_is_json_ready_with_numpy_numbers() -> None:
    f = Finding(
        "DataLoaderBottleneck",
        "critical",
        "Input pipeline",
        {"share": np.float64(0.8557123456789), "steps": np.int64(79), "role": "worker"},
        "Set num_workers=7",
        6.92857,
    )
    d = json.loads(json.dumps(f.to_dict()))
    assert d == {
        "rule": "DataLoaderBottleneck",
        "severity": "critical",
        "title": "Input pipeline",
        "evidence": {"share": 0.855712, "steps": 79, "role": "worker"},
        "recommendation": "Set num_workers=7",
        "est_speedup": 6.929,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"severity": "fatal"}, "severity must be one of"),
        ({"est_speedup": 0.5}, "est_speedup must be"),
    ],
)
def test_invalid_findings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Finding(**({"rule": "R", "severity": "info", "title": "t"} | kwargs))


def test_impact_orders_by_severity_then_speedup() -> None:
    a = Finding("A", "warning", "a", est_speedup=3.0)
    b = Finding("B", "critical", "b")
    c = Finding("C", "warning", "c", est_speedup=1.2)
    d = Finding("D", "info", "d", est_speedup=5.0)
    assert sorted([a, b, c, d], key=Finding.impact_key, reverse=True) == [b, a, c, d]
