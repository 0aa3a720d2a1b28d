"""EVIDENCE: `gpufeed bench` experiments that reproduce published findings on input-bound training
(experiments, their workload and training runs; the augload grid's summary: augload_report), result tables (results), charts (plots), and a
local Ray cluster for the offload benchmark (raycluster). `bench.tune` only keeps the old import
path of `load_settings` working (deprecated: use `gpufeed.data.load_settings`)."""
