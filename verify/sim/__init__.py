"""A deterministic simulation test (DST) of the wal3 engine.

One seed fully determines a run: a virtual-time event loop (``loop``), an in-memory object store
whose operations complete after seed-chosen delays and fail in seed-chosen ways (``store``), the
engine's actors driven by the seed (``actors``), and a model of what the log must hold checked
after every step (``model``).  ``run`` runs seeds and summarises them; ``python -m verify.sim``.
"""

from .run import RunResult, run_seed

__all__ = ["RunResult", "run_seed"]
