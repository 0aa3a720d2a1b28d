"""Every module imports on its own, in a fresh interpreter: no module works only because another
was imported first (a hidden order, a circle broken by luck)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gpufeed

PACKAGE = Path(gpufeed.__file__).parent


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "bootstrap" in parts or parts[-1] == "__main__":
            continue  # run at interpreter start / as a program, not imported
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _import_alone(name: str) -> tuple[str, int, str]:
    cp = subprocess.run(
        [sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=300
    )
    return name, cp.returncode, cp.stderr[-2000:]


def test_every_module_imports_on_its_own_in_a_fresh_process():
    modules = _modules()
    assert "gpufeed.data.loader" in modules and "gpufeed.text" in modules
    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [r for r in pool.map(_import_alone, modules) if r[1] != 0]
    assert not failed, "\n\n".join(f"{name}:\n{err}" for name, _, err in failed)
