"""Adapters that record a framework's training with kforge_record (docs: README "Recording").

Each module imports its framework when it is imported, never before: ``import kforge_record``
stays free of them. ``hf`` (transformers Trainer), ``lightning``, ``accelerate``, ``kempnerforge`` (with
``kempnerforge_config``: what it reads from KempnerForge's config; ``kempnerforge_replicas``: its replica groups).

    hf.py         a Hugging Face Trainer callback
    lightning.py  a Lightning callback and logger
    accelerate.py an Accelerate tracker
    kempnerforge.py  KempnerForge's MetricsTracker, recorded by kforge
    kempnerforge_config.py  what it reads from KempnerForge's JobConfig
    kempnerforge_replicas.py  which ranks hold the same parameters, and this rank's checksum name
    _common.py    what the adapters share: JSON-safe hyperparameters, a two-hook phase timer, the import error
"""
