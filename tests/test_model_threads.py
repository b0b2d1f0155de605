"""``CORRAL_MODEL_THREADS`` caps the CPU threads of a local model's generation, on a
machine whose cores are shared (docs/providers.md): the model actor and the
``llama_cpp.server`` corral starts both take it; a bad value is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.core.model_threads import THREADS_ENV, generation_threads
from tests.harness import running, wait_for


def test_the_cap_lowers_the_declared_threads_and_never_raises_them() -> None:
    assert generation_threads(2, {}) == 2
    assert generation_threads(2, {THREADS_ENV: "1"}) == 1
    assert generation_threads(4, {THREADS_ENV: " 3 "}) == 3
    assert generation_threads(1, {THREADS_ENV: "8"}) == 1, "a cap, not a default"


@pytest.mark.parametrize("value", ["", "0", "-1", "two", "1.5", "257"])
def test_a_bad_cap_is_a_clear_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=f"{THREADS_ENV} must be an integer from 1 to 256, not {value!r}"):
        generation_threads(2, {THREADS_ENV: value})


def _model_log(home: Path) -> str:
    logs = list((home / "logs").glob("model-*.log"))
    return logs[0].read_text() if logs else ""


def test_the_model_actor_loads_with_the_capped_thread_count(short_tmp: Path) -> None:
    """A model declared with two threads, under a cap of one: its actor says so."""
    (short_tmp / "ws").mkdir()
    spec = ('[project]\nroot = "ws"\n[[models]]\nid = "m"\npath = "smollm2"\nn_threads = 2\n'
            '[[agents]]\nid = "a"\nprovider = "local"\n  [agents.local]\n  model = "m"\n')
    with running(short_tmp / "home", spec, env={THREADS_ENV: "1"}) as daemon:
        wait_for("the model to load", lambda: "loaded in" in _model_log(daemon.home))
        assert "with 1 thread(s)" in _model_log(daemon.home), _model_log(daemon.home)


def test_a_bad_cap_fails_the_models_load_with_the_reason_in_its_status(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = ('[project]\nroot = "ws"\n[[models]]\nid = "m"\npath = "smollm2"\nmax_restarts = 0\n'
            '[[agents]]\nid = "a"\nprovider = "local"\n  [agents.local]\n  model = "m"\n')
    with running(short_tmp / "home", spec, env={THREADS_ENV: "two"}) as daemon:
        [model] = wait_for("the model's load to end", lambda: [
            m for m in daemon.status()["models"] if m["status"] not in ("starting", "loading")])
        assert model["status"] == "failed", model
        assert model["error"] == f"ValueError: {THREADS_ENV} must be an integer from 1 to 256, not 'two'"
        assert "Traceback" not in _model_log(daemon.home), _model_log(daemon.home)
