"""Typed config: presets, overrides, validation with clear messages."""

import pytest

from hvd_ctsm.config import (ConfigError, TrainConfig, config_from_argv, from_dict, load_config,
                             preset_names)
from hvd_ctsm.errors import EXIT_BAD_INPUT


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
    ("model.uniform_bce_weight=-1", "model.uniform_bce_weight must be >= 0"),
    ("model.attention_dropout=1", "model.attention_dropout must be in"),
    ("model.future_targets=0", "model.future_targets must be >= 1"),
    ("model.future_decay=0", "model.future_decay must be in (0, 1]"),
    ("optim.adam_beta2=1", "optim.adam_beta2 must be in"),
])
def test_bad_values_stop_with_a_clear_error(override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(None, [override])


def test_uniform_bce_weight_needs_the_full_softmax():
    with pytest.raises(ValueError, match="needs model.loss=full"):
        load_config(None, ["model.loss=bce", "model.uniform_bce_weight=1"])
    with pytest.raises(ValueError, match="future_targets > 1 needs model.loss=full"):
        load_config(None, ["model.loss=sampled", "model.future_targets=2"])


def test_missing_config_file_names_the_presets():
    with pytest.raises(ValueError, match="presets"):
        load_config("no-such-preset")


def test_override_values_get_their_fields_declared_types():
    """YAML 1.1 reads `1e-3` as a string; the field says float, so it is one."""
    cfg = load_config("default", ["optim.lr=1e-3", "dist.fusion_threshold_mb=null",
                                  "dist.cycle_time_ms=5", "dist.sleeping_wait=true",
                                  "model.head_weights={next_item: 1, sale: 0.25}"])
    assert cfg.optim.lr == 0.001 and type(cfg.optim.lr) is float
    assert cfg.dist.fusion_threshold_mb is None
    assert cfg.dist.cycle_time_ms == 5.0 and type(cfg.dist.cycle_time_ms) is float
    assert cfg.dist.sleeping_wait is True
    assert cfg.model.head_weights == {"next_item": 1.0, "sale": 0.25}
    assert all(type(w) is float for w in cfg.model.head_weights.values())


@pytest.mark.parametrize("override, expected", [
    ("epochs=3.7", "epochs=3.7 has the wrong type: expected int"),
    ("data.batch_size=2.5", "data.batch_size=2.5 has the wrong type: expected int"),
    ("model.layers=true", "model.layers=true has the wrong type: expected int"),
    ("epochs=abc", "epochs=abc has the wrong type: expected int"),
    ("optim.lr=fast", "optim.lr=fast has the wrong type: expected float"),
    ("optim.lr=nan", "optim.lr=nan has the wrong type: expected a finite float"),
    ("model.side_features=2", "model.side_features=2 has the wrong type: expected bool"),
    ("model.head_weights=3", "model.head_weights=3 has the wrong type: expected a mapping"),
    ("model.head_weights={next_item: x}", "model.head_weights[next_item]=x has the wrong type"),
    ("model=3", "model=3 has the wrong type: expected a mapping of ModelConfig fields"),
])
def test_values_the_type_cannot_hold_are_refused_naming_field_value_and_type(override, expected):
    with pytest.raises(ConfigError) as refused:
        load_config("default", [override])
    assert str(refused.value).startswith(f"config: {expected}")


def test_a_preset_value_of_the_wrong_type_is_refused_too(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("epochs: 2.5\noptim:\n  lr: 1e-3\n")
    with pytest.raises(ConfigError, match=r"epochs=2.5 has the wrong type: expected int"):
        load_config(str(preset))
    preset.write_text("epochs: 2\noptim:\n  lr: 1e-3\n")
    assert load_config(str(preset)).optim.lr == 0.001


def test_presets_are_overrides_of_the_dataclass_defaults():
    assert load_config(None) == TrainConfig() == load_config("default")  # it overrides nothing
    sasrec = load_config("sasrec")
    assert sasrec.epochs == 200 != TrainConfig().epochs and sasrec.model.dim == 50
    assert sasrec.dist == TrainConfig().dist  # what the preset leaves out keeps its default
    # the baseline reads items and positions only; the default also reads the items' tags
    assert TrainConfig().model.item_tags and not sasrec.model.item_tags
    assert not sasrec.model.side_features and not sasrec.model.item_category
    assert sasrec.model.learned_positions  # the paper's learned positions, whatever the default
    # the default trains the p(sale) head beside next-item; the baseline has no sale head
    assert TrainConfig().model.head_weights == {"next_item": 1.0, "sale": 0.5}
    assert sasrec.model.head_weights == {"next_item": 1.0}
    assert set(preset_names()) >= {"default", "ml100k", "sasrec"}


def test_config_from_argv_turns_flags_and_overrides_into_one_config():
    cfg, args = config_from_argv(["--data", "/d", "--out", "/r", "--epochs", "3", "--config",
                                  "sasrec", "optim.lr=1e-3", "--resume"])
    assert (cfg.data.path, cfg.out, cfg.epochs, cfg.optim.lr) == ("/d", "/r", 3, 0.001)
    assert cfg.data.batch_size == 128 and args.resume and not args.print_config
    with pytest.raises(ConfigError, match="--data DIR is required"):
        config_from_argv(["--out", "/r"])
    with pytest.raises(ConfigError, match="epochs=2.5 has the wrong type"):
        config_from_argv(["--data", "/d", "--epochs", "2.5"])


def test_the_spark_pipeline_refuses_a_bad_trainer_value_before_any_step(tmp_path, capsys):
    from spark_jobs import pipeline

    code = pipeline.main(["--source", "synthetic:clients=10", "--work", str(tmp_path / "work"),
                          "--registry", str(tmp_path / "registry"), "epochs=3.7"])
    assert code == EXIT_BAD_INPUT
    assert "epochs=3.7 has the wrong type: expected int" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()  # no Spark, no feature step, no worker


def test_the_spark_pipeline_takes_a_time_split_and_refuses_one_without_cutoffs(tmp_path, capsys):
    """Before, the pipeline had --split time but no --cutoffs: its feature step always failed."""
    from spark_jobs import pipeline

    args = ["--source", "synthetic:clients=10", "--work", str(tmp_path / "work"),
            "--registry", str(tmp_path / "registry"), "--split", "time"]
    assert pipeline.main(args) == EXIT_BAD_INPUT
    assert "--cutoffs T1,T2" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()
    parsed = pipeline.parse_args([*args, "--cutoffs", "2021-07-01,1633046400"])
    cfg = pipeline.PipelineConfig(source=parsed.source, work=parsed.work, registry=parsed.registry,
                                  split=parsed.split, cutoffs=parsed.cutoffs)
    assert cfg.features(tmp_path / "f").cutoffs == (1625097600, 1633046400)
    parsed = pipeline.parse_args([*args[:-2], "--event-type", "purchase"])
    cfg = pipeline.PipelineConfig(source="events:log.csv", work=parsed.work,
                                  registry=parsed.registry, event_type=parsed.event_type)
    assert cfg.features(tmp_path / "f").event_type == "purchase"  # a purchase log's type


def test_the_spark_pipeline_refuses_a_registry_or_work_folder_it_may_not_write_first(tmp_path):
    """`--registry decoy.txt` (a file) ran the features and the training, 2 minutes, then
    failed at deploy with '[Errno 17] File exists'."""
    from hvd_ctsm.errors import run_cli
    from spark_jobs import pipeline

    decoy = tmp_path / "decoy.txt"
    decoy.write_text("a user's notes")
    args = ["--source", "synthetic:clients=10", "--work", str(tmp_path / "work"),
            "--registry", str(decoy)]
    assert run_cli(pipeline.main, "hvd-ctsm pipeline", args) == EXIT_BAD_INPUT
    assert not (tmp_path / "work").exists() and decoy.read_text() == "a user's notes"
    # --work a feature dataset: the features step would have written into it, after Spark
    from hvd_ctsm.files import outputs

    (tmp_path / "feat").mkdir()
    outputs.mark(tmp_path / "feat", "features")
    args[3], args[5] = str(tmp_path / "feat"), str(tmp_path / "registry")
    assert run_cli(pipeline.main, "hvd-ctsm pipeline", args) == EXIT_BAD_INPUT
    assert [p.name for p in (tmp_path / "feat").iterdir()] == [outputs.MARKER]


def test_the_spark_pipeline_refuses_a_work_folder_of_the_users_own_files(tmp_path, capsys):
    """Before, --work a folder of the user's files ran every step and wrote features/, model/
    and the reports beside them; train --out and features --out refuse such a folder."""
    from hvd_ctsm.errors import run_cli
    from hvd_ctsm.files import outputs
    from spark_jobs import pipeline

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's notes")
    args = ["--source", "synthetic:clients=10", "--work", str(mine),
            "--registry", str(tmp_path / "registry")]
    assert run_cli(pipeline.main, "hvd-ctsm pipeline", args) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "it holds files the pipeline did not write" in err and len(err.splitlines()) == 1, err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    with pytest.raises(ValueError, match="is a file, not a folder"):  # mkdir failed after Spark
        pipeline.check_work(mine / "notes.txt")
    # A work folder a run made is taken again: marked (a run marks it), or from before marks
    # (what a run writes and nothing else); the user's file beside it is not ours.
    earlier = tmp_path / "earlier"
    for name in ("features", "model", "mlflow", ".features.tmp-1a2b3c4d"):
        (earlier / name).mkdir(parents=True)
    for name in ("pipeline.json", "backtest.json", ".pipeline.json.x1y2.tmp"):
        (earlier / name).write_text("{}")
    pipeline.check_work(earlier)
    (earlier / "registry").mkdir()  # --registry WORK/registry: the user's own layout
    pipeline.check_work(earlier, earlier / "registry")
    with pytest.raises(outputs.UnsafeOutputError, match="files the pipeline did not write"):
        pipeline.check_work(earlier, tmp_path / "registry")  # a registry elsewhere
    (earlier / "registry").rmdir()
    (earlier / "notes.txt").write_text("a user's notes")
    with pytest.raises(outputs.UnsafeOutputError, match="files the pipeline did not write"):
        pipeline.check_work(earlier)
    outputs.mark(earlier, "pipeline")
    pipeline.check_work(earlier)
    outputs.mark(earlier, "run")  # another program's output: not a work folder
    with pytest.raises(outputs.UnsafeOutputError, match="holds hvd_ctsm run output"):
        pipeline.check_work(earlier)


def test_print_config_prints_the_resolved_config_and_starts_nothing(tmp_path, capsys):
    import yaml

    from hvd_ctsm.train import launch
    out = tmp_path / "run"
    assert launch.main(["--config", "sasrec", "--out", str(out), "optim.lr=1e-3",
                        "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 0.001 and printed["data"]["batch_size"] == 128
    assert load_config("sasrec", ["optim.lr=1e-3", f"out={out}"]) == \
        from_dict(TrainConfig, printed)  # what it prints is the config a run would use
    assert not out.exists()


def test_the_optimizer_takes_adam_beta2_from_the_config():
    import torch

    from hvd_ctsm.train.support import make_optimizer

    model = torch.nn.Linear(2, 1)
    for overrides, beta2 in (([], 0.999), (["optim.adam_beta2=0.98"], 0.98)):
        optim = load_config(None, ["optim.item_weight_decay=null", *overrides]).optim
        group = make_optimizer(model, optim, lr=0.01).param_groups[0]
        assert group["betas"] == (0.9, beta2) and group["lr"] == 0.01


def test_item_weight_decay_puts_the_item_table_in_a_group_of_its_own():
    from hvd_ctsm.config.model_config import ModelConfig
    from hvd_ctsm.model.ctsm import CTSM, ModelSizes
    from hvd_ctsm.train.support import make_optimizer

    model = CTSM(ModelSizes(num_items=30, num_event_types=3, attr_sizes=[], max_len=8),
                 ModelConfig(dim=16, layers=1, heads=2))
    plain = make_optimizer(model, load_config(
        None, ["optim.weight_decay=0.1", "optim.item_weight_decay=null"]).optim, lr=0.01)
    assert [g["weight_decay"] for g in plain.param_groups] == [0.1]
    baseline = make_optimizer(model, load_config("sasrec").optim, lr=0.01)
    assert [g["weight_decay"] for g in baseline.param_groups] == [0.0]
    optim = load_config(None, ["optim.weight_decay=0.1", "optim.item_weight_decay=2"]).optim
    others, items = make_optimizer(model, optim, lr=0.01).param_groups
    assert items["params"] == [model.encoder.item.weight] and items["weight_decay"] == 2.0
    assert others["weight_decay"] == 0.1 and len(others["params"]) + 1 == len(
        list(model.parameters()))
    with pytest.raises(ConfigError, match="item_weight_decay"):
        load_config(None, ["optim.item_weight_decay=-1"])


def test_auto_item_decay_is_5_below_8_training_targets_an_item_and_none_above():
    import dataclasses

    import torch

    from hvd_ctsm.data.dataset_meta import DatasetMeta
    from hvd_ctsm.train.support import (make_optimizer, resolve_item_weight_decay,
                                        with_item_decay_resolved)

    assert load_config(None, []).optim.item_weight_decay == "auto"
    assert resolve_item_weight_decay("auto", 7.9) == 5.0
    assert resolve_item_weight_decay("auto", 8.0) is None
    assert resolve_item_weight_decay(2.0, 1.0) == 2.0 and resolve_item_weight_decay(None, 1) is None
    for value, parsed in (("auto", "auto"), ("null", None), ("0", 0.0), ("5", 5.0)):
        assert load_config(None, [f"optim.item_weight_decay={value}"]).optim.item_weight_decay \
            == parsed
    with pytest.raises(ConfigError, match="item_weight_decay"):
        load_config(None, ["optim.item_weight_decay=often"])

    def meta(train_targets: int, items: int) -> DatasetMeta:  # vocab counts padding's index 0
        return DatasetMeta({"splits": {"train": {"targets": train_targets}},
                            "vocab": {"items": items + 1}})

    cfg = load_config(None, ["data.path=x"])
    sparse = with_item_decay_resolved(cfg, meta(7_000, 1_000))
    assert sparse.optim.item_weight_decay == 5.0 and cfg.optim.item_weight_decay == "auto"
    assert with_item_decay_resolved(cfg, meta(8_000, 1_000)).optim.item_weight_decay is None
    set_by_user = load_config(None, ["data.path=x", "optim.item_weight_decay=2"])
    assert with_item_decay_resolved(set_by_user, meta(10, 1_000)) is set_by_user
    with pytest.raises(ValueError, match="with_item_decay_resolved"):
        make_optimizer(torch.nn.Linear(2, 1), cfg.optim, lr=0.01)
    assert dataclasses.replace(sparse.optim, lr=1.0).item_weight_decay == 5.0


def test_a_resume_across_item_decay_settings_names_the_setting_that_resumes_it():
    import torch

    from hvd_ctsm.train.support import check_same_param_groups

    one = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters())
    model = torch.nn.Linear(2, 2)
    two = torch.optim.AdamW([{"params": [model.weight]}, {"params": [model.bias]}])
    old = {"optimizer": one.state_dict(), "config": {"optim": {}}}  # saved before the setting
    check_same_param_groups(old, one)
    with pytest.raises(ConfigError, match="optim.item_weight_decay=null"):
        check_same_param_groups(old, two)
    decayed = {"optimizer": two.state_dict(), "config": {"optim": {"item_weight_decay": 5.0}}}
    with pytest.raises(ConfigError, match="optim.item_weight_decay=5.0, and this run"):
        check_same_param_groups(decayed, one)
