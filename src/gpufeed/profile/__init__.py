"""COLLECT: run directory, system sampler, step recorder, zero-code hooks, crash-safe store."""
