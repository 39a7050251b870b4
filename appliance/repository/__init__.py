"""Model repositories: scanning folders, version policy, loading and serving model versions."""
