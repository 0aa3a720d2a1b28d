"""ADVISE: the commands that tell a user how to feed their model. `diagnose` (is training
input-bound, and what would help; what it found and prints: diagnosis_report), `tune` (the fastest
Loader settings; the trials, their JSON and table: tune_result), what `--data` names
(inputs), their short measurements (measure), what they say while measuring (progress), the Ray
offload sizing (offload) and the naive per-image baseline they compare against (naive)."""
