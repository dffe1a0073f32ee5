"""Filtering shards and Parquet files: the per-shard pipeline, decisions, Parquet output, resharding
and sidecars (shard I/O is in ``collapseguard.io``, the engines in ``collapseguard.engines``)."""
