"""Typed config: presets, overrides, validation with clear messages."""

import pytest

from hvd_ctsm.config import load_config


def test_preset_and_overrides():
    cfg = load_config("default", ["optim.lr=0.002", "dist.compression=fp16", "epochs=3",
                                  "model.head_weights={next_item: 1.0}"])
    assert cfg.optim.lr == 0.002 and cfg.dist.compression == "fp16" and cfg.epochs == 3
    assert cfg.model.head_weights == {"next_item": 1.0}
    assert cfg.data.batch_size == 64  # from the preset


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-1", "optim.lr must be > 0"),
    ("dist.compression=int8", "dist.compression='int8' is not one of"),
    ("model.dim=63", "not divisible"),
    ("optim.lr_scaling=cubic", "optim.lr_scaling"),
    ("data.batchsize=3", "unknown keys ['batchsize']"),
    ("epochs=0", "epochs must be >= 1"),
])
def test_bad_values_stop_with_a_clear_error(override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(None, [override])


def test_missing_config_file_names_the_presets():
    with pytest.raises(ValueError, match="presets"):
        load_config("no-such-preset")
