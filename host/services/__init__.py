"""The host's services, each with its own state, wired by ``host.server.Server``: ``dirtyset``
(the server's dirty log: marks and purges), ``rollups`` (roll-up scheduling), ``untracked`` (the
dirty set's invariant check), ``adoption`` (taking over a departed host's dirty set), ``gc`` (GC
scheduling).
"""
