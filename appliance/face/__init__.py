"""The face: the `edge-appliance` command (cli.py), its signal handlers; may import every layer."""
