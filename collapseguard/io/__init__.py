"""The floor of the data plane: reading and writing the files collapseguard works on.

- ``tar``: WebDataset tar shards as samples of raw bytes (never decoded or re-encoded), and
  deterministic writing of them;
- ``parse``: each argument parsed once into an ``Input`` (kind, origin, names), and the rule for
  ``pipe:`` (an existing file is a file; a command runs only from the user's own argument);
- ``inputs``: what a command's arguments name (files, folders, shards, Parquet files, brace
  patterns), expanded into ``Input`` values and image files;
- ``parquet``: Parquet files whose rows hold images as bytes (Hugging Face ``Image`` structs,
  binary columns), read in batches and written back with their schema;
- ``urls``: opening a name as a stream: local paths, ``file:``, ``pipe:CMD``, fsspec URLs;
- ``outdir``: filter's ``--out`` as a local folder or an object-storage prefix (atomic commits);
- ``calibration_file``: the calibration JSON format and the packaged defaults.
- ``terminal``: names from data made safe to print (control characters escaped).

Image decoding is ``collapseguard.images``.
"""
