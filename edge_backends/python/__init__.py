"""Triton-compatible Python models: `model.py` with `TritonPythonModel`, run in worker processes."""
