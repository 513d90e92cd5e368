"""A stand-in ``vllm`` package for the local backend's bad-input tests (no distribution
metadata, like the CPU wheel's ``vllm`` lookup). Only its API-server module exists."""
