"""The training progress: a tqdm bar on a terminal, with log lines above it; a log line every
30 s where stderr is a file or a pipe (no carriage returns piling up in a log)."""

import logging
import sys
from contextlib import contextmanager

import pytest

from hvd_ctsm.progress import Progress, duration
from hvd_ctsm.train import support
from hvd_ctsm.train.support import log_lines_above_the_bar, progress_bar


@contextmanager
def logging_to_stderr():
    """A plain handler, made inside the test: it writes to capsys's stderr."""
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.parametrize("redirected", [True, False])
def test_a_log_line_during_training_gets_a_line_of_its_own_above_the_bar(capsys, monkeypatch,
                                                                         redirected):
    """Through a plain handler (logging.basicConfig's), the validation line was glued to the
    end of the bar's line: `train: 100%|...| 282/282 [...]2026-11-29 ... epoch 2 val ...`."""
    monkeypatch.setattr(support, "on_a_terminal", lambda: True)
    with logging_to_stderr(), log_lines_above_the_bar(redirected):
        bar = progress_bar(True, 4, 0)
        bar.update(1)
        logging.getLogger("hvd_ctsm.train").info("epoch 1 val full ndcg@10=0.2668")
        bar.update(3)
        bar.close()
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert ("epoch 1 val full ndcg@10=0.2668" in lines) == redirected, lines
    assert any(line.startswith("train: 100%") for line in lines)


def test_without_a_terminal_progress_is_a_line_now_and_then(capsys):
    """capsys's stderr is no terminal, as a log file is not: no bar, no carriage return; a line
    with the steps done of all, the time, the time left and the last logged loss."""
    with logging_to_stderr(), log_lines_above_the_bar(True):
        bar = progress_bar(True, 1700, 100)
        assert isinstance(bar, Progress)
        bar.every_s = 0.0  # a line at every update, for the test
        bar.set_postfix(loss="7.123", rows_s="950")
        bar.update(1)
        bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    line, = [line for line in err.splitlines() if line.startswith("train:")]
    assert line.startswith("train: 101 of 1,700 steps, 0 s, about ")
    assert line.endswith(" left; loss 7.123, rows_s 950"), line


def test_a_line_waits_for_its_interval(capsys):
    bar = Progress(10, "train", "steps", every_s=3600.0)
    for _ in range(10):
        bar.update(1)
    assert bar.done == 10 and capsys.readouterr().err == ""


def test_the_time_left_is_at_this_runs_pace_from_where_it_resumed():
    bar = Progress(1000, "train", "steps", initial=900)
    bar.done = 950  # 50 steps in 60 s: 50 left, 60 s
    assert bar.line(60.0) == "train: 950 of 1,000 steps, 60 s, about 60 s left"


@pytest.mark.parametrize(("seconds", "text"), [(42, "42 s"), (600, "10 min"), (9000, "2.5 h")])
def test_times_read_in_the_unit_that_fits(seconds, text):
    assert duration(seconds) == text
