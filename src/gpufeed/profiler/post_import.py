"""Post-import hooks: a patch runs right after a watched module executes, whoever imports it.

`PostImportFinder` goes first on `sys.meta_path`; it lets the real finders find the module and wraps
their loader, so the profiler needs no torch import of its own to hook torch.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Lets the real finders find a watched module and runs its patch right after it executes."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self._patches = patches

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = self._patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader; after `exec_module` applies the patch (errors only warn)."""

    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as e:  # a torch change must never break the user's import
            sys.stderr.write(f"gpufeed: warning: could not hook {module.__name__}: {e}\n")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
