"""ADVISE: the commands that tell a user how to feed their model. `diagnose` (is training
input-bound, and what would help), `tune` (the fastest Loader settings), what `--data` names
(inputs), their short measurements (measure), what they say while measuring (progress), the Ray
offload sizing (offload) and the naive per-image baseline they compare against (naive)."""
