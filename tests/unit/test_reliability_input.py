"""Bad input to the trainer: bad config values, a rank with an empty shard, a slow rank.

Each is injected for real: main(argv) with the bad value, a real dataset with one row group for
two ranks, a real rank delayed (`debug.step_delay_s`, test-only) under horovodrun.
This file holds the unit-tier part; the rest is in tests/integration/test_reliability_input.py."""

import pytest

from hvd_ctsm.data.batches import DatasetError
from hvd_ctsm.files import outputs
from hvd_ctsm.train import launch


def run_folder(tmp_path):
    """A run folder as the trainer makes one: marked ours (the config is saved by each test)."""
    out = tmp_path / "run"
    out.mkdir()
    outputs.mark(out, "run")
    return out


@pytest.mark.parametrize("override, message", [
    ("data.batch_size=0", "data.batch_size must be >= 1, got 0"),
    ("commit_every_steps=0", "commit_every_steps must be >= 1, got 0"),
    ("model.dim=50", "model.dim 50 is not divisible by model.heads 4"),
    ("epochs=abc", "epochs=abc has the wrong type: expected int"),
    ("optim.lrr=0.1", "unknown keys ['lrr']"),
    ("dist.op=max", "dist.op='max' is not one of ['adasum', 'average']"),
    ("epochs=1.5", "epochs=1.5 has the wrong type: expected int"),
])
def test_bad_config_stops_with_a_clear_error_before_any_worker(tmp_path, override, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        launch.main(["--data", str(tmp_path / "data"), "--out", str(out), override])
    assert str(stop.value).startswith("error: config: ") and message in str(stop.value)
    assert not out.exists()  # nothing started: no run folder, no Horovod


def test_resume_with_another_model_shape_stops_in_one_line(tmp_path):
    from hvd_ctsm.config import load_config, save_config

    out = run_folder(tmp_path)
    save_config(load_config(None, ["model.dim=32"]), out / "config.yaml")
    with pytest.raises(SystemExit) as stop:
        launch.main(["--data", str(tmp_path / "data"), "--out", str(out), "--resume",
                    "model.dim=16"])
    message = str(stop.value)
    assert message.startswith("error: --resume: ") and "\n" not in message
    assert "model.dim=32" in message and "model.dim=16" in message


def test_resume_of_a_run_from_before_a_default_changed_names_the_overrides(tmp_path):
    """A run started with the 2 x 2 default, after the default became 3 x 4: resumed with no
    override it continues with its own settings (and goes on to the dataset, missing here);
    resumed with the default preset asked for, the fix is to pass the saved values."""
    from hvd_ctsm.config import load_config, save_config

    out = run_folder(tmp_path)
    save_config(load_config(None, ["model.layers=2", "model.heads=2",
                                   "model.attention_dropout=null"]), out / "config.yaml")
    args = ["--data", str(tmp_path / "data"), "--out", str(out), "--resume"]
    with pytest.raises(DatasetError, match="point --data at a folder written by"):
        launch.main(args)
    with pytest.raises(SystemExit) as stop:
        launch.main([*args, "--config", "default"])
    assert ("pass model.attention_dropout=null model.heads=2 model.layers=2 to resume it"
            in str(stop.value))


def test_resume_of_a_run_saved_before_a_setting_existed_names_what_it_trained_with(tmp_path):
    """A config.yaml without item_tags (a run from before the setting) trained without tags;
    resumed under today's default it would fail deep inside loading the checkpoint."""
    import yaml

    from hvd_ctsm.config import load_config, save_config

    out = run_folder(tmp_path)
    save_config(load_config(None), out / "config.yaml")
    saved = yaml.safe_load((out / "config.yaml").read_text())
    del saved["model"]["item_tags"]
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(SystemExit) as stop:
        launch.main(["--data", str(tmp_path / "data"), "--out", str(out), "--resume"])
    assert "pass model.item_tags=false to resume it" in str(stop.value)


def test_resume_may_change_how_new_weights_are_drawn(tmp_path):
    """model.feature_init_std only draws a new model's weights: a run from before its default
    changed resumes with no override (and goes on to the dataset, missing here)."""
    from hvd_ctsm.config import load_config, save_config

    out = run_folder(tmp_path)
    save_config(load_config(None, ["model.feature_init_std=null"]), out / "config.yaml")
    with pytest.raises(DatasetError, match="point --data at a folder written by"):
        launch.main(["--data", str(tmp_path / "data"), "--out", str(out), "--resume"])


def test_a_missing_dataset_names_the_fix(tmp_path):
    with pytest.raises(DatasetError, match="point --data at a folder written by"):
        launch.main(["--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "run")])


def test_broken_yaml_is_bad_input_naming_the_file_and_the_line(tmp_path):
    """A YAML file or override that does not parse was 'crashed: ParserError' (exit 3)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: [1\n")
    out = run_folder(tmp_path)
    (out / "config.yaml").write_text("model: {dim: 16\n")  # the run's own settings, damaged
    data = ["--data", str(tmp_path / "data")]
    for args, named in ((["--out", str(tmp_path / "new"), "--config", str(bad)], bad),
                        (["--out", str(out), "--resume"], out / "config.yaml"),
                        (["--out", str(out), "--resume", "--config", "default"],
                         out / "config.yaml")):
        with pytest.raises((SystemExit, ValueError)) as stop:  # each exit 2 (run_cli)
            launch.main([*data, *args])
        message = str(stop.value).removeprefix("error: ")
        assert message.startswith(f"config: config file {named} is not valid YAML at line 2, "
                                  "column 1: ") and "\n" not in message
    with pytest.raises(SystemExit, match="debug.step_delay_s is not valid YAML at line 1"):
        launch.main([*data, "--out", str(tmp_path / "new"), 'debug.step_delay_s={"1": 2'])


def test_resume_of_a_folder_without_a_run_is_refused(tmp_path, monkeypatch):
    """A mistyped --out with --resume started a new run there, exit 0, as if it went on.
    Workers torchrun restarts resume too, and their run may not have checkpointed yet: they
    go on (to the dataset, missing here)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "typo", empty):
        with pytest.raises(SystemExit) as stop:
            launch.main(["--data", str(tmp_path / "data"), "--out", str(out), "--resume"])
        assert str(stop.value) == (f"error: --resume: {out} holds no run to continue: check "
                                   "--out, or drop --resume to start a new run there")
    assert not (tmp_path / "typo").exists()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(DatasetError, match="point --data at a folder written by"):
        launch.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "new"),
                     "--resume", "--check"])
