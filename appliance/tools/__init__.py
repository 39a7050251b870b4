"""The operator's tools: check, tune, pin and status; may import the flags and every layer below."""
