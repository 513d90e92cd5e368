"""chunktune: find the best chunked-prefill settings for a vLLM deployment by measuring them."""

__version__ = "0.1.0"
