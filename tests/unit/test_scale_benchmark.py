"""The scale benchmark's bookkeeping (benchmarks/scale.py): phases from the trainer's log and
the medians of cells run in rounds."""

import pytest

from benchmarks import scale


def test_phase_seconds_are_each_steps_share_of_its_time_medianed_over_steps():
    log = [{"time/step_seconds": t, "time_share/forward": f, "time_share/backward": 1 - f,
            "samples_per_s": 1.0} for t, f in [(1.0, 0.5), (2.0, 0.25), (4.0, 0.5)]]
    assert scale.phase_seconds(log) == {"forward": 0.5, "backward": 1.5}


def test_rounds_report_their_medians_and_each_rounds_step_time():
    rounds = [{"engine": "torch", "np": 2, "seconds_per_step": s, "rows_per_s": 10 / s,
               "phase_seconds": {"forward": s / 2}} for s in (0.3, 0.1, 0.2)]
    run = scale.repeated(rounds)
    assert run["seconds_per_step"] == pytest.approx(0.2)
    assert run["rows_per_s"] == pytest.approx(50.0)
    assert run["phase_seconds"] == {"forward": pytest.approx(0.1)}
    assert run["round_seconds_per_step"] == [0.3, 0.1, 0.2]
    assert scale.repeated(rounds[:1]) == rounds[0]  # one round: the run as it was
