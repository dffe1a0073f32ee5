"""Mixed chains: two replication processes applied in turn at every step.

Real generators rarely show one clean kind of damage. A mixed replicator draws two different
component families (each with its own parameters, slightly weakened) and applies both per step;
``params`` records the components and their parameters.
"""

from __future__ import annotations

from collapseguard.training_data_tools.replicators import base
from collapseguard.training_data_tools.replicators.base import Replicator


class MixedReplicator(Replicator):
    family = "mixed"
    description = "two other families applied in turn each step (mixed processes)"

    def __init__(self, rng, **overrides):
        pool = [f for f in base.list_families() if f != self.family]
        comps = overrides.pop("components", None)
        if comps is None:
            comps = [str(c) for c in rng.choice(pool, 2, replace=False)]
        bad = [c for c in comps if c not in pool]
        if bad or len(comps) < 1:
            raise base.ReplicatorError(f"mixed: components must be among {pool}, got {comps}")
        weaken = [float(rng.uniform(0.55, 0.85)) for _ in comps]
        self.parts = []
        for c, k in zip(comps, weaken):
            part = base.create_replicator(c, rng)
            part.params["strength"] = float(part.params.get("strength", 1.0) * k)
            self.parts.append(part)
        super().__init__(rng, **overrides)
        self.params = {"components": list(comps),
                       **{f"{i}_{c}": part.params for i, (c, part) in enumerate(zip(comps, self.parts))}}

    def _step(self, image, rng):
        x = image
        for part in self.parts:
            x = part.step(x, rng)
            self.state.update(part.state)
        return x
