"""Replicators: simulated generative re-rendering, one family per kind of damage.

``list_families()`` names them, ``create_replicator(family, rng)`` makes one per chain (drawing its
parameters from ``rng``), and ``Replicator.step(image, rng)`` makes the next image of the chain.
"""

from collapseguard.training_data_tools.replicators.base import (
    REPLICATORS,
    Replicator,
    ReplicatorError,
    create_replicator,
    list_families,
    missing_families,
    needs_text,
    replicator_class,
)

__all__ = ["REPLICATORS", "Replicator", "ReplicatorError", "create_replicator", "list_families",
           "missing_families", "needs_text", "replicator_class"]
