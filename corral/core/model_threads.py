"""How many CPU threads a local model's generation uses: what its spec declares
(``[[models]] n_threads``, 2 by default), capped by ``CORRAL_MODEL_THREADS`` when
that is set.

The cap is for a machine whose cores are shared (a CI runner, a test run on two
workers): llama.cpp's threads meet at a spinning barrier after every operation, so
on a busy core one descheduled thread keeps the others spinning, and a
generation costs far more CPU than its work. One thread then does the same work
with nothing to wait for. The model actor and the ``llama_cpp.server`` corral
starts (corral/acceptance/llama_server.py) both read it."""

from __future__ import annotations

from collections.abc import Mapping

THREADS_ENV = "CORRAL_MODEL_THREADS"
MAX_THREADS = 256


def generation_threads(declared: int, environ: Mapping[str, str]) -> int:
    """``declared``, lowered to the cap in ``environ`` (never raised by it). A cap
    that is not an integer from 1 to ``MAX_THREADS`` is a ``ValueError`` naming it."""
    raw = environ.get(THREADS_ENV)
    if raw is None:
        return declared
    try:
        cap = int(raw.strip())
    except ValueError:
        cap = 0
    if not 1 <= cap <= MAX_THREADS or not raw.strip().isdigit():
        raise ValueError(f"{THREADS_ENV} must be an integer from 1 to {MAX_THREADS}, not {raw!r}")
    return min(declared, cap)
