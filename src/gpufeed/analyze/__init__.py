"""UNDERSTAND: load a run into pandas, statistics, bottleneck rules."""
