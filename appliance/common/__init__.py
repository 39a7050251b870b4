"""The shared words every layer may use: errors, types, tensors, settings, the config schema.

Imports nothing else from appliance/ (edge_backends' datatypes excepted).
"""
