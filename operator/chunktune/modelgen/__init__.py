"""Model directories written locally: configurations and tokenizers that need no model hub.

Public names: :func:`write_tiny_model`, :class:`TinyModelSpec`, :data:`TINY`.
"""

from chunktune.modelgen.tiny import TINY, TinyModelSpec, is_tiny_model_dir, write_tiny_model

__all__ = ["TINY", "TinyModelSpec", "is_tiny_model_dir", "write_tiny_model"]
