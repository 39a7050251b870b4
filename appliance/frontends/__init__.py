"""Protocol front ends: wire format <-> core types, nothing else."""
