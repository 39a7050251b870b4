"""tritonserver's command line: flags -> the settings dataclasses of common/settings.py.

May import the front ends and every layer below; the face and the tools read flags through it.
"""
