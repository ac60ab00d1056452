"""kforge_record: a tiny, crash-safe recorder of per-step training facts (see docs/CONTRACT.md).

Imports only pyarrow (and torch when the training process already has it).
"""

from .model import ModelSpec
from .recorder import Recorder
from .schema import SCHEMA_VERSION, SchemaError
from .version import __version__

__all__ = ["Recorder", "ModelSpec", "SCHEMA_VERSION", "SchemaError", "__version__"]
