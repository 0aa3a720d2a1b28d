"""DEMO: `gpufeed demo` profiles a naive and a gpufeed training run on an embedded photo-like data
set and compares them: the comparison (compare), its sizes, checks and work dir (demo_options), the training script it runs (train), the data (synth)."""
