"""Import runs of other trackers (TensorBoard event files, W&B offline runs) as kforge runs (docs/imports.md)."""
