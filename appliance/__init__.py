"""edge-appliance: a Triton-compatible inference server for edge devices."""

__version__ = "0.1.0"
