"""Transport-neutral services both front ends call: inference and control."""
