"""COLLECT: the run directory and its identity (session), system sampler (psutil + NVML), step
recorder (steps), zero-code PyTorch hooks (autopatch, bootstrap/), crash-safe store, secret redaction
(redact), `gpufeed profile -- CMD` (launch) and the in-code `gpufeed.profile`/`gpufeed.step` (api)."""
