"""The black-box reliability harness: real hosts under seeded store faults, crashes and kills.

``python -m verify.reliability --quick`` (one small seed per scenario), the long form with
``--write-doc``, or one schedule with ``--scenario NAME --seed S``.  The modules: ``run`` (the
command line and the report), ``scenarios`` (the fault schedules), ``core`` (writers, readers and
the audit), ``infra`` (hosts in-process and as processes, the crash latch) and ``host`` (the
faulty host a process scenario launches).
"""
