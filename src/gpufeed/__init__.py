"""gpufeed: see what a GPU training run is doing, know what holds it back, and keep the GPU fed.

Public API (kept small on purpose):

- ``gpufeed.profile(out=None, name=None, interval=0.2)``: context manager that profiles the code inside it.
- ``gpufeed.step(samples=None)``: mark a training step where autopatching cannot see one.
- ``gpufeed.load(path) -> Run``: a run directory as pandas frames.
- ``gpufeed.analyze(run) -> list[Finding]``: the built-in bottleneck rules.
- ``gpufeed.data``: ``pack``, ``ShardDataset``, ``Loader``, ``Augment``, ``load_settings`` (there
  after ``import gpufeed``: its names are imported on first use).

These facades, ``gpufeed.integrations.*`` and ``gpufeed.train`` (the examples' training pieces)
are the public API; every other module path is internal.

Packages: ``profiler`` (COLLECT), ``analysis`` (UNDERSTAND), ``present`` (SHOW: renders only),
``commands`` (load → analyze → render → write: show, ls, report, trace, export), ``data`` (FEED),
``advise`` (diagnose, tune), ``demo``, ``train`` (MODEL), ``bench`` (EVIDENCE: experiments),
``integrations`` (trainer callbacks). Shared helpers: ``errors`` (GpufeedError), ``atomic``
(atomic file writes), ``devices`` (default device), ``hardware`` (the machine, for results),
``extras`` (optional dependencies).
"""

from __future__ import annotations

from gpufeed import data as data  # costs nothing: its names are imported on first use
from gpufeed.analysis.api import analyze, load
from gpufeed.profiler.api import profile, step

__version__ = "0.1.0"
__all__ = ["__version__", "analyze", "load", "profile", "step"]
