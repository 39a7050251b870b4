"""The server: the composition root (app.py), the listeners, TLS and the one shutdown deadline.

May import the flags, front ends, services, runtime, scheduling, repository, ops and common.
"""
