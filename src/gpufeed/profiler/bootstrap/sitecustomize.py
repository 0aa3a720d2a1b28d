"""gpufeed bootstrap: `gpufeed profile` puts this directory first on the child's PYTHONPATH.

Python imports it at start-up in every interpreter of the profiled command. It installs gpufeed's
post-import hooks for torch (nothing is recorded until a process actually trains), except in the
torchrun launcher, and then runs the sitecustomize that this file shadows, if there is one.
"""

from __future__ import annotations

import os
import sys


def _is_launcher() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)
    if any(a in ("torch.distributed.run", "torch.distributed.launch") for a in argv):
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) == "torchrun"


def _install() -> None:
    if not os.environ.get("GPUFEED_RUN_DIR") or _is_launcher():
        return
    try:
        from gpufeed.profiler.autopatch import install
    except ImportError:
        # An interpreter without gpufeed installed: use the package `gpufeed profile` runs from.
        parent = os.environ.get("GPUFEED_PKG_PARENT")
        if not parent:
            return
        sys.path.append(parent)
        try:
            from gpufeed.profiler.autopatch import install
        except ImportError as e:
            sys.stderr.write(
                f"gpufeed: warning: cannot load the profiler in {sys.executable}: {e}\n"
            )
            return
    install()


def _chain() -> None:
    """Execute the next `sitecustomize` on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install()
except Exception as e:  # the profiler must never stop the user's program from starting
    sys.stderr.write(f"gpufeed: warning: profiler not installed: {e}\n")
_chain()
