"""The rules page: every section of the rule registry (the warm-up, then each rule in the order
`gpufeed rules` lists them) with its docstring, what it does without GPU data and its parameters
(default, accepted values, meaning), read from `gpufeed.analysis.rules.registry` itself."""

from __future__ import annotations

import inspect
from typing import Any

from markdown_text import cell, prose, table


def rules_markdown() -> str:
    """Markdown for the whole registry: one `##` section per rule, headed by its id."""
    from gpufeed.analysis.rules.context import WARMUP_ID, WARMUP_PARAMS
    from gpufeed.analysis.rules.registry import RULES

    parts = [
        f"## {WARMUP_ID}",
        "Steps skipped at the start of each rank before any rule looks at the run.",
        params_table(WARMUP_PARAMS),
    ]
    for rid, rule in RULES.items():
        summary, _, details = inspect.cleandoc(type(rule).__doc__ or "").partition("\n")
        parts += [f"## {rid}", f"**{prose(summary.strip())}**"]
        if details.strip():
            parts.append(prose(details.strip()))
        if rule.cpu_only:
            parts.append(f"*Without GPU data:* {prose(rule.cpu_only)}")
        parts.append(params_table(rule.all_params()))
    return "\n\n".join(parts) + "\n"


def params_table(params: dict[str, Any]) -> str:
    """The parameters of one section: name, default as in gpufeed.toml, accepted values, meaning."""
    rows = [
        (f"`{name}`", f"`{toml_value(p.default)}`", accepts(p), cell(p.doc))
        for name, p in params.items()
    ]
    return table(("parameter", "default", "accepts", "meaning"), rows)


def toml_value(value: float | int | bool) -> str:
    """A default as it is written in gpufeed.toml and on the command line."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def accepts(param: Any) -> str:
    """The values `Param.coerce` takes for a parameter."""
    if isinstance(param.default, bool):
        return "true or false"
    if param.share:
        return f"a share, {param.least:g}–1"
    whole = "a whole number" if isinstance(param.default, int) else "a number"
    return f"{whole} ≥ {param.least:g}"
