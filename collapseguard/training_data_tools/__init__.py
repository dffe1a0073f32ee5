"""Training-data tools: clean sources, replicators, replication-chain manifests, loaders, export."""

from collapseguard.training_data_tools.manifest import (
    REQUIRED_COLUMNS,
    ManifestError,
    read_manifest,
    split_by_source,
    validate_manifest,
    write_manifest,
)

__all__ = ["REQUIRED_COLUMNS", "ManifestError", "read_manifest", "split_by_source",
           "validate_manifest", "write_manifest"]
