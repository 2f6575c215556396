"""Catalog scale for real: the scale benchmark's quick mode, and a 200,000-item synthetic
catalog trained by two torchrun ranks under a memory bound (the dense loss's tensors alone
would need about 6 GB a rank there; bounds, not speeds, are asserted)."""

from __future__ import annotations

import json

import pytest

from benchmarks import scale
from benchmarks.common import build_features

pytestmark = [pytest.mark.slow]
RANK_BOUND_GB = 3.0


def test_scale_benchmark_quick_measures_every_cell(tmp_path):
    assert scale.main(["--quick", "--engines", "torch,pair", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "scale_quick.json").read_text())
    assert (tmp_path / "scale_quick.png").stat().st_size > 0
    assert "| 4,000 | torch np=2 |" in "\n".join(scale.render(result))
    assert [c["loss"] for c in result["loss"]] == list(scale.LOSSES)
    assert all(c["seconds"] > 0 for c in result["loss"])
    for cell in result["train"]:
        assert cell["vocab_items"] == cell["items"] + 1  # cover=1: every item, plus padding
        assert [(r["engine"], r["np"]) for r in cell["runs"]] == [
            ("single", 1), ("torch", 2), ("pair", 2)]
        assert all(r["exchange_mb"] > 0 and len(r["peak_rss_gb_by_rank"]) == r["np"]
                   for r in cell["runs"])
        for r in cell["runs"]:  # the step's phases, which add up to the step
            assert set(r["phase_seconds"]) >= {"data", "forward", "backward", "step"}
            assert 0 < sum(r["phase_seconds"].values()) <= 1.5 * r["seconds_per_step"]
        assert cell["backtest"]["seconds"] > 0 and cell["score"]["seconds"] > 0


def test_200k_items_train_at_np2_with_the_shared_loss_and_sparse_exchange_in_bounded_memory(
        tmp_path):
    data = build_features("synthetic:clients=2000,items=200000,events=420000,seed=5,cover=1",
                          tmp_path / "data", tmp_path / "features.log", max_len=50, row_groups=8)
    assert json.loads((data / "metadata.json").read_text())["vocab"]["items"] == 200_001
    cell = scale.train_cell(data, tmp_path, "torch", 2, steps=4)
    assert "shared: sampled softmax" in cell["loss_log"][0]  # auto chose it above 50,000 items
    assert "the optimizer moves only the rows a step reads" in cell["loss_log"][0]
    assert max(cell["peak_rss_gb_by_rank"]) < RANK_BOUND_GB, cell
    assert cell["exchange_mb"] < 0.2 * cell["dense_exchange_mb"], cell
    assert cell["ranks_in_sync"], cell  # each rank catches up other rows (optim.lazy_rows)
