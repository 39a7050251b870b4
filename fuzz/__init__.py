"""Long-running fuzzing of the decoders and parsers (python -m fuzz.run; scripts/fuzz)."""
