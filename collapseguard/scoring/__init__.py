"""The one scoring loop: samples or image files in, one scored row per sample out.

- ``records``: ``score_records`` decodes each sample's images (pixel caps, formats by content),
  scores them in batches with a detector and records every failure as a reason, never an abort;
- ``run``: ``score`` over many inputs (images, folders, shards) through an engine, to a table.
"""
