"""Callbacks that profile a trainer's fit and write the report at its end.

- ``gpufeed.integrations.lightning.GpufeedCallback``: PyTorch Lightning (``lightning`` or
  ``pytorch_lightning``), ``Trainer(callbacks=[GpufeedCallback()])``.
- ``gpufeed.integrations.huggingface.GpufeedCallback``: a Hugging Face ``TrainerCallback``,
  ``Trainer(..., callbacks=[GpufeedCallback()])``.

What both do (profile from the fit's start to its end, then write the report) lives in ``fit``.

A gpufeed ``Loader`` needs nothing in Lightning: it goes where a DataLoader goes. For Hugging Face,
``gpufeed.integrations.huggingface.LoaderTrainer`` takes Loaders where datasets go (``DictBatches``
feeds a Trainer subclass of one's own).
"""
