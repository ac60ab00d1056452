"""Adapters that record a framework's training with kforge_record (docs: README "Recording").

Each module imports its framework when it is imported, never before: ``import kforge_record``
stays free of them. ``hf`` (transformers Trainer), ``lightning``, ``accelerate``, ``kempnerforge`` (with
``kempnerforge_config``: what it reads from KempnerForge's config; ``kempnerforge_replicas``: its replica groups).
"""
