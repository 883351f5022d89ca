"""The host's services, each with its own state, wired by ``host.server.Server``.

What the routes call: ``records`` (appends, reads, state, fragments), ``cursors`` (cursors and
the compaction cursor), ``lifecycle`` (seal, fork, a GC pass, scrub), ``dirty`` (the dirty set's
API).  What runs beside them: ``dirtyset`` (the server's dirty log: marks and purges),
``rollups`` (roll-up scheduling), ``untracked`` (the dirty set's invariant check), ``adoption``
(taking over a departed host's dirty set), ``gc`` (GC scheduling).
"""
