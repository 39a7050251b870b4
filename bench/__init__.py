"""Benchmarks: `python -m bench.run` measures the server against raw ONNX Runtime."""
