"""Request scheduling: batching decisions, the batcher, instance worker threads, statistics."""
