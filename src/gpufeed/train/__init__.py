"""MODEL: ResNets and a training loop (AMP, channels_last, DDP)."""
