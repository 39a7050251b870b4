"""Ops: logs, trace, systemd notify, memory, GPU readings, build info; may import only common."""
