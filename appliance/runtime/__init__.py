"""The model runtime: specs built from config, the registry, the lifecycle, the loader."""
