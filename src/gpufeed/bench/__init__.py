"""EVIDENCE: embedded demo data, experiments, diagnose, tune, demo."""
