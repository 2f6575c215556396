"""The model search's summary: a seed run again counts once, by its latest record."""

from benchmarks.model_search import summary_rows


def record(seed: int, ndcg: float) -> dict:
    metrics = {"ndcg@10": ndcg, "sampled_ndcg@10": ndcg}
    return {"data": "d", "trial": "t", "ranks": 2, "seed": seed, "seconds": 60.0, "val": metrics,
            "test": {**metrics, "popularity_ndcg@10": 0.0, "popularity_sampled_ndcg@10": 0.0}}


def test_a_seed_run_again_counts_once_by_its_latest_record():
    rows = summary_rows([record(0, 0.1), record(1, 0.3), record(0, 0.2)])
    assert len(rows) == 3  # the header, its rule, one row
    cells = [c.strip() for c in rows[2].split("|")]
    assert cells[4] == "2"  # seeds 0 and 1, not three runs
    assert cells[5] == "0.2500 [0.2000-0.3000]"  # seed 0's rerun (0.2) replaces its 0.1
