"""The floor of the data plane: reading and writing the files collapseguard works on.

- ``tar``: WebDataset tar shards as samples of raw bytes (never decoded or re-encoded), and
  deterministic writing of them;
- ``inputs``: what a command's arguments name (files, folders, shards, brace patterns);
- ``calibration_file``: the calibration JSON format and the packaged defaults.

Image decoding is ``collapseguard.images``.
"""
