"""Baseline workloads: the raw limits (pynng, multiprocessing, SQLite, a Python call)
and the peers (Ray, Pykka, Thespian). Every module here is imported by the runner
(``bench.runner.load_workloads``); a new module only has to use ``@workload``."""
