"""The training progress bar and the log lines written while it runs."""

import logging
import sys

import pytest

from hvd_ctsm.train.support import log_lines_above_the_bar, progress_bar


@pytest.mark.parametrize("redirected", [True, False])
def test_a_log_line_during_training_gets_a_line_of_its_own_above_the_bar(capsys, redirected):
    """Through a plain handler (logging.basicConfig's), the validation line was glued to the
    end of the bar's line: `train: 100%|...| 282/282 [...]2026-11-29 ... epoch 2 val ...`."""
    handler = logging.StreamHandler(sys.stderr)  # made now: writes to the captured stderr
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with log_lines_above_the_bar(redirected):
            bar = progress_bar(True, 4, 0)
            bar.update(1)
            logging.getLogger("hvd_ctsm.train").info("epoch 1 val full ndcg@10=0.2668")
            bar.update(3)
            bar.close()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert ("epoch 1 val full ndcg@10=0.2668" in lines) == redirected, lines
    assert any(line.startswith("train: 100%") for line in lines)
