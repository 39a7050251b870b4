"""Logging set-up that reads well in journald (no timestamps of our own under systemd)."""

from __future__ import annotations

import logging
import os
import sys


def configure(verbose: int) -> None:
    level = logging.DEBUG if verbose > 0 else logging.INFO
    if os.environ.get("JOURNAL_STREAM"):
        fmt = "%(levelname)s %(name)s: %(message)s"  # journald stamps each line itself
    else:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if verbose <= 0:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
