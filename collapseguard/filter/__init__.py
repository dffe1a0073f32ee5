"""Filtering WebDataset shards: shard I/O, the per-shard pipeline, engines (local processes, Ray)."""
