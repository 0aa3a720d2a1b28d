"""Fixtures for the rule specifications (the helpers live in rule_runs.py, a uniquely named module)."""

from __future__ import annotations

import pytest
from rule_runs import RunBuilder


@pytest.fixture
def builder() -> RunBuilder:
    return RunBuilder()
