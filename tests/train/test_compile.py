"""torch.compile on the trainer's own thread (one test: a first compile costs ~1 min on 2 cores)."""

import threading

import pytest

from engine import rundir
from engine.config import resolve
from engine.events import read_events
from engine.run.owner import start

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop


def _losses(tmp_path, data, name, **flags):
    config = resolve("micro", None, {"data.path": str(data), "speed.device": "cpu", "speed.precision": "fp32",
                                     "train.max_steps": 6, "train.eval_interval": 100} | flags)
    errors = []

    def work():  # as the TUI does: build, compile and train on a worker thread
        try:
            start(config, tmp_path / name).run()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    events, _ = read_events(tmp_path / name / rundir.EVENTS)
    return [e.loss for e in events if e.event == "step"]


def test_compiled_training_on_a_worker_thread_matches_eager(tmp_path, tiny_dataset):
    """Compiled with the chunked linear + cross-entropy (its custom backward under the
    compiler too) against eager with the plain loss: one compile covers both."""
    eager = _losses(tmp_path, tiny_dataset, "eager")
    compiled = _losses(tmp_path, tiny_dataset, "compiled", **{"speed.compile": True, "model.loss": "chunked"})
    assert len(compiled) == len(eager) == 6
    assert compiled == pytest.approx(eager, rel=1e-3)
