"""Early stopping's patience in data (early_stop_rows): how many validations without a better one
the trainer waits for, by how many training rows an epoch reads."""

from types import SimpleNamespace

from hvd_ctsm.config import load_config
from hvd_ctsm.train.trainer import Trainer, patience_evals


def test_small_epochs_keep_five_validations_and_large_ones_wait_for_two():
    cfg = load_config(None, [])  # a validation every 2 epochs, at most 5, 12,000 rows
    # ML-100K reads 1,088 rows an epoch at 1 rank and 1,024 at 2; the synthetic set 1,216 and
    # 1,152: the 5 validations their defaults were tuned with.
    for rows in (1024, 1088, 1152, 1216):
        assert patience_evals(cfg, rows) == 5
    assert patience_evals(cfg, 2000) == 3  # 4,000 rows a validation: 3 read 12,000
    assert patience_evals(cfg, 5632) == 2  # 8,000 clients of about 9 events, at 2 ranks
    assert patience_evals(cfg, 30_000) == 2  # never fewer than 2: one validation is noisy
    assert patience_evals(load_config(None, ["early_stop_rows=0"]), 30_000) == 5
    assert patience_evals(load_config(None, ["early_stop_evals=1"]), 30_000) == 1
    assert patience_evals(load_config(None, ["early_stop_evals=9"]), 1024) == 6


def test_training_stops_after_the_patience_of_its_epoch_size():
    best = {"ndcg@10": 0.38, "epoch": 6}
    large = SimpleNamespace(cfg=load_config(None, []), rows_per_epoch=5632)
    assert not Trainer.no_longer_improving(large, best, 8)
    assert Trainer.no_longer_improving(large, best, 10)  # 2 validations (4 epochs) on
    small = SimpleNamespace(cfg=load_config(None, []), rows_per_epoch=1088)
    assert not Trainer.no_longer_improving(small, best, 14)
    assert Trainer.no_longer_improving(small, best, 16)  # 5 validations (10 epochs) on


def test_the_log_names_an_early_stop_only_where_it_can_come_first():
    """epochs=2 logged 'or earlier after 5 validations (10 epochs)': a stop after the end."""
    from hvd_ctsm.train.loop import ends_when

    assert ends_when(load_config(None, ["epochs=2"]), 1000) == "training ends at epoch 2 (epochs)"
    assert ends_when(load_config(None, ["epochs=30", "early_stop_evals=0"]), 1000) == \
        "training ends at epoch 30 (epochs)"
    assert ends_when(load_config(None, ["epochs=30", "early_stop_rows=0"]), 1000).startswith(
        "training ends at epoch 30 (epochs), or earlier after 5 validations in a row")


def test_the_log_says_max_steps_where_it_ends_the_run_first():
    """max_steps=1 logged 'training ends at epoch 100 (epochs), or earlier after 5 validations'
    and then stopped after one step."""
    from hvd_ctsm.train.loop import ends_when

    smoke = load_config(None, ["max_steps=1"])
    assert ends_when(smoke, 1000, total_steps=2000) == \
        "training ends after step 1 (max_steps), of the 2,000 its 100 epochs take"
    long = load_config(None, ["epochs=30", "early_stop_rows=0", "max_steps=1500"])
    assert ends_when(long, 1000, total_steps=3000).startswith(  # 15 epochs: an early stop first
        "training ends after step 1,500 (max_steps), of the 3,000 its 30 epochs take, or "
        "earlier after 5 validations in a row")
    assert ends_when(load_config(None, ["epochs=2", "max_steps=50"]), 1000, total_steps=40) == \
        "training ends at epoch 2 (epochs)"  # the epochs end first
