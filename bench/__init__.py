"""corral benchmarks: corral's figures next to the raw limits and the peers.

Run from the repository root as ``python -m bench`` (``--help`` for the options).

This package is deliberately empty at import time: multiprocessing (spawn) and Ray
workers import ``bench`` to find their targets, and anything imported here would be
charged to every one of those child processes.
"""
