"""gpufeed: see what a GPU training run is doing, know what holds it back, and keep the GPU fed.

Public API (kept small on purpose):

- ``gpufeed.profile(out=None, name=None, interval=0.2)``: context manager that profiles the code inside it.
- ``gpufeed.step(samples=None)``: mark a training step where autopatching cannot see one.
- ``gpufeed.load(path) -> Run``: a run directory as pandas frames.
- ``gpufeed.analyze(run) -> list[Finding]``: the built-in bottleneck rules.
- ``gpufeed.data``: ``pack``, ``ShardDataset``, ``Loader``, ``load_settings``.

Packages: ``profile`` (COLLECT), ``analyze`` (UNDERSTAND), ``present`` (SHOW: renders only),
``commands`` (load → analyze → render → write: show, ls, report, trace, export), ``data`` (FEED),
``advise`` (diagnose, tune), ``demo``, ``train`` (MODEL), ``bench`` (EVIDENCE: experiments),
``integrations`` (trainer callbacks). Shared helpers: ``errors`` (GpufeedError), ``atomic``
(atomic file writes), ``devices`` (default device), ``hardware`` (the machine, for results),
``extras`` (optional dependencies).
"""

from __future__ import annotations

# The sub-packages `profile` and `analyze` share their names with public functions. Import the
# packages first so that later submodule imports never rebind `gpufeed.profile`/`gpufeed.analyze`
# to the package; then bind the functions. Internal code therefore always uses
# `from gpufeed.profile.x import y`, never `import gpufeed.profile.x as y`.
import gpufeed.analyze as _analyze_pkg  # noqa: F401
import gpufeed.profile as _profile_pkg  # noqa: F401
from gpufeed.analyze.api import analyze, load
from gpufeed.profile.api import profile, step

__version__ = "0.1.0"
__all__ = ["__version__", "analyze", "load", "profile", "step"]
