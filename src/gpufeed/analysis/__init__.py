"""UNDERSTAND: a run directory as pandas frames (run, combine for multi-host runs), statistics
(stats: percentiles, phases), the bottleneck rules (rules/, one file per rule, their registry)
with thresholds from gpufeed.toml (config), and what a rule concludes (finding). `api` holds the
public `load` and `analyze`."""
