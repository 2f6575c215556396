"""The scale benchmark's bookkeeping (benchmarks/scale.py): phases from the trainer's log and
the medians of cells run in rounds."""

import pytest

from benchmarks import code_ab, scale


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


def test_the_caption_says_when_a_cell_is_a_median_of_rounds():
    def caption(rounds):
        sizes = {"items": [1000], "clients": 10, "events": 100, "steps": 8, "rounds": rounds}
        return next(line for line in scale.render({"sizes": sizes, "train": []})
                    if line.startswith("Training with"))

    assert "the median of 3 rounds" in caption(3)
    assert "median" not in caption(1)


def test_a_kept_dataset_of_other_sizes_is_refused_not_reused(tmp_path):
    kept = tmp_path / "data-1000"
    kept.mkdir()
    (kept / "metadata.json").write_text(
        '{"source": "synthetic:clients=300,items=1000,events=9000,seed=7,cover=1"}')
    with pytest.raises(SystemExit, match="was built from .*clients=300.* give another"):
        scale.train_part([1000], clients=20_000, events=2_000_000, steps=3, engines=[],
                         work=tmp_path / "work", features=tmp_path)


def test_a_code_ab_reports_medians_their_ratio_and_whether_the_parameters_matched():
    def runs(seconds, checksum):
        return [{"engine": "torch", "np": 2, "seconds_per_step": s, "rows_per_s": 1 / s,
                 "phase_seconds": {"forward": s / 2}, "parameter_checksums": [checksum]}
                for s in seconds]

    same = code_ab.compare(runs([0.4, 0.5, 0.6], "abc"), runs([0.3, 0.4, 0.2], "abc"))
    assert same["this_over_before"] == pytest.approx(0.3 / 0.5)
    assert same["round_ratios"] == pytest.approx([0.75, 0.8, 1 / 3])
    assert same["same_parameters"]
    assert not code_ab.compare(runs([0.4], "abc"), runs([0.3], "abd"))["same_parameters"]


def test_a_code_ab_alternates_which_revision_runs_first():
    from pathlib import Path

    before, this = Path("before"), Path("this")
    orders = [[side for side, _ in code_ab.sides_in_round(n, before, this)] for n in range(4)]
    assert orders == [["before", "this"], ["this", "before"]] * 2
