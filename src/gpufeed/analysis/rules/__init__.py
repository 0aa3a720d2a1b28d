"""The built-in bottleneck rules, one module per rule, on what every rule shares: the base class
(base), its parameters (params) and what rules read from a run (context). The registry (`RULES`,
`run_rules`, the `--set` parameters) lives in `registry`, re-exported here as the import path.
"""

from __future__ import annotations

from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.params import Param
from gpufeed.analysis.rules.registry import RULES, describe, run_rules, settings, validate

__all__ = ["RULES", "Context", "Param", "Rule", "describe", "run_rules", "settings", "validate"]
