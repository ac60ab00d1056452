"""Import runs of other trackers (TensorBoard event files, W&B offline runs) as kforge runs (docs/imports.md).

    api.py        import every run of a TensorBoard log folder or of W&B offline runs under a kforge ROOT
    source.py     what an importer reads from one run, before it becomes kforge shards
    tfrecord.py   TFRecord framing, read with checksums
    tensorboard.py  TensorBoard event files, read as EventAccumulator does
    scalar_events.py  the common scalar event decoded for all records at once (numpy)
    wandb_log.py  W&B offline runs (.wandb transaction logs), read as wandb's reader does
    tag_columns.py  which kforge column each imported tag becomes
    table.py      an imported run's points as kforge rows: one row per step, one column per tag
    shards.py     an imported run written as kforge shards
"""
