"""Inference backends behind one small contract (see api.py). Imports nothing from appliance."""
