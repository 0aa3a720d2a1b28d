"""Rule thresholds from `gpufeed.toml` and `--set RULE.param=value`, checked against the rule registry.

```toml
[rules.warmup]
steps = 10

[rules.DataLoaderBottleneck]
threshold = 0.3

[rules.StepOutlier]
enabled = false
```
`--set` wins over the file; unknown rules or parameters are errors that name them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpufeed.analysis.rules.params import ConfigError
from gpufeed.analysis.rules.registry import checked_overrides

__all__ = ["DEFAULT_FILE", "ConfigError", "load_file", "parse_sets", "resolve"]

DEFAULT_FILE = "gpufeed.toml"


def load_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The `[rules.*]` tables of a TOML file, validated ({section: {param: value}})."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}): save it as UTF-8 TOML, e.g. [rules.DataLoaderBottleneck] threshold = 0.3"
        ) from None
    toml = _toml()
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    # other tables are left to other tools; a misspelt [rules] would silently judge with defaults
    typo = next((k for k in data if k != "rules" and _near("rules", k)), None)
    if typo is not None:
        raise ConfigError(
            f"{path}: [{typo}] is not read; thresholds go in [rules.RULE] tables, "
            "e.g. [rules.DataLoaderBottleneck] threshold = 0.3"
        )
    rules = data.get("rules", {})
    if not isinstance(rules, dict):
        raise ConfigError(f"{path}: 'rules' must be a table like [rules.DataLoaderBottleneck]")
    for key, value in rules.items():
        if not isinstance(value, dict):
            raise ConfigError(
                f"{path}: rules.{key} = {value!r} is not a table; write it as "
                f"[rules.RULE] with param = value lines (see `gpufeed rules`)"
            )
    return checked_overrides(rules, where=str(path))


def parse_sets(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`RULE.param=value` strings (from `--set`), validated."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name or not value.strip():
            raise ConfigError(
                f"--set {item!r}: expected RULE.param=value, e.g. DataLoaderBottleneck.threshold=0.3"
            )
        out.setdefault(section, {})[name.strip()] = value.strip()
    return checked_overrides(out, where="--set")


def resolve(
    config: str | Path | None = None, sets: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """Overrides for `run_rules`: `config` (else ./gpufeed.toml if present), then `--set` on top."""
    if config is None and Path(DEFAULT_FILE).is_file():
        config = DEFAULT_FILE
    merged = load_file(config) if config is not None else {}
    for section, values in parse_sets(sets).items():
        merged.setdefault(section, {}).update(values)
    return merged


def _near(word: str, key: str) -> bool:
    import difflib

    return difflib.SequenceMatcher(None, key.lower(), word).ratio() >= 0.75


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:
        raise ConfigError(
            "reading gpufeed.toml needs Python 3.11+ or the 'tomli' package (pip install tomli)"
        ) from None
    return tomli
