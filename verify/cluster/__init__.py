"""A cluster in a box (issue 17): ``python -m verify.cluster`` / ``make cluster``, and the API the
end-to-end tests start it with: :func:`start` returns a :class:`Cluster` (``front_url``, ``hosts``,
``kill9(host)``, ``stop(host)``, ``close()``)."""

from .core import Cluster, Compactor, Host, start

__all__ = ["Cluster", "Compactor", "Host", "start"]
