"""Every benchmark's --quick mode runs for real on a tiny dataset, so the benchmarks never rot.

Nothing here asserts a speed (timings belong in benchmarks/RESULTS.md): the tests check that each
benchmark launches the real entry points, saves a stamped result with sane fields, and that the
report renders every section.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from benchmarks import (backends, code_ab, comm, gpu, gpu_parity, input_pipeline, model_search,
                        quality, quality_report, report, scaling, spark_features, trainer_ab)
from benchmarks.common import run_until

pytestmark = [pytest.mark.slow, pytest.mark.horovod]


# One fixture per benchmark, all writing into one folder: each test's setup runs only what it
# reads (minutes in all under two test workers; pytest-timeout counts setup in each test).
@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-results")


@pytest.fixture(scope="module")
def data(tiny_features) -> list[str]:
    return ["--data", str(tiny_features)]


@pytest.fixture(scope="module")
def scaling_run(data, results):
    assert scaling.main([*data, "--config", "default", "--quick", "--out", str(results)]) == 0
    assert input_pipeline.main([*data, "--quick", "--scaling", str(results / "scaling.json"),
                                "--config", "default", "--out", str(results)]) == 0
    return results


@pytest.fixture(scope="module")
def comm_run(data, results):
    assert comm.main([*data, "--quick", "--out", str(results)]) == 0
    return results


@pytest.fixture(scope="module")
def quality_run(data, results):
    assert quality.main([*data, "--quick", "--out", str(results)]) == 0
    return results


@pytest.fixture(scope="module")
def ab_run(data, results):
    # One A/B under torchrun covers both launchers' code paths: horovodrun is the default of
    # every other trainer run above.
    assert trainer_ab.main([*data, "--config", "default", "--epochs", "2",
                            "--repeats", "1", "--backend", "torch", "--name", "read_ahead",
                            "--variant", "data.read_ahead_steps=0",
                            "--variant", "data.read_ahead_steps=4", "--out", str(results)]) == 0
    return results


def load(results, name):
    payload = json.loads((results / f"{name}.json").read_text())
    assert payload["machine"]["cores"] >= 1 and payload["machine"]["commit"]
    return payload


def test_scaling_reads_the_trainers_own_timers(scaling_run):
    s = load(scaling_run, "scaling")["summary"]["sizes"]
    assert set(s) == {"1", "2"}
    assert s["1"]["time_vs_np1"] == 1.0
    for n in ("1", "2"):
        assert s[n]["epoch_seconds"]["median"] > 0
        assert 0 <= s[n]["allreduce_share"]["median"] < 1 and 0 <= s[n]["data_share"]["median"] < 1
    split = load(scaling_run, "scaling")["summary"]["np2_wait_split_per_step"]
    assert 0 <= split["least_waiting_rank_share"]["median"] <= split["allreduce_share"]["median"]
    assert (scaling_run / "scaling_time.png").read_bytes()[:4] == b"\x89PNG"


def test_input_pipeline_compares_both_decoders(scaling_run):
    p = load(scaling_run, "input_pipeline")
    reading = p["read_rows_per_s_per_rank"]
    assert all(reading[name]["median"] > 0 for name in ("arrow", "ours", "petastorm_np_load"))
    assert p["trainer"]["rows_per_s_per_rank"]["median"] > 0
    # --quick trains 2 epochs, logged once per epoch: one data share for each.
    assert [len(r) for r in p["data_wait_by_epoch"]["runs"]] == [2]
    assert all(0 <= share < 1 for share in p["data_wait_by_epoch"]["runs"][0])


def test_comm_runs_horovod_and_ddp_on_the_same_model(comm_run):
    p = load(comm_run, "comm")
    peer = p["peer"]
    assert peer["runs"]["horovod"][0]["parameters"] == peer["runs"]["ddp"][0]["parameters"]
    assert peer["runs"]["horovod"][0]["size"] == peer["runs"]["ddp"][0]["size"] == 2
    # The independent pair: two single-rank workers, each on one rank's batches.
    assert [w["compute"] > 0 for w in peer["runs"]["pair"][0]["per_worker"]] == [True, True]
    assert peer["horovod_over_pair"]["median"] > 0 and peer["ddp_over_pair"]["median"] > 0
    hvd_run = peer["runs"]["horovod"][0]
    assert [set(t) >= {"main"} for t in hvd_run["cpu_by_thread"]] == [True, True]
    assert 0 <= hvd_run["wait_cpu_share"] <= 1.5 and hvd_run["other_threads_cores"] >= 0
    variants = p["knobs"]["default"]["variants"]
    assert variants["defaults"]["vs_defaults"]["median"] == 1.0
    # fp16 compression halves the bytes on the wire.
    assert variants["fp16"]["gradient_bytes_per_step"] * 2 == \
        variants["defaults"]["gradient_bytes_per_step"]


def test_quality_backtests_each_effective_batch(quality_run):
    table = load(quality_run, "quality")["table"]
    assert table["x2"]["effective_batch"] == 2 * table["x1"]["effective_batch"]
    assert all(0 <= t["ndcg@10"]["mean"] <= 1 for t in table.values())


def test_quality_report_trains_ctsm_and_the_baseline_and_reuses_logged_cells(tiny_features,
                                                                            tmp_path):
    args = ["--data", str(tiny_features), "--quick", "--out", str(tmp_path)]
    assert quality_report.main(args) == 0
    trials = [json.loads(line) for line in (tmp_path / "quality_report_quick.jsonl").open()]
    assert sorted(t["trial"] for t in trials) == ["tiny-ctsm", "tiny-sasrec"]
    assert {t["data"] for t in trials} == {tiny_features.name}
    text = (tmp_path / "quality_report_quick.md").read_text()
    assert "| tiny | ctsm | 1 of 1 |" in text and "| tiny | sasrec | 1 of 1 |" in text
    rows = {cells[2].strip(): [c.strip() for c in cells[1:-1]]
            for cells in (line.split("|") for line in text.splitlines())
            if len(cells) > 2 and cells[1].strip() == "tiny"}
    sale = -4  # the sale AUC column: train minutes, the best epoch and minutes to it follow
    assert rows["sasrec"][sale] == "-" and float(rows["ctsm"][sale].split()[0]) > 0
    assert 0 < float(rows["popularity"][sale]) < 1  # popularity's p(sale): its items' sale rate
    assert int(rows["ctsm"][-2]) >= 1 and float(rows["ctsm"][-1]) > 0  # time to the kept epoch
    assert quality_report.main(args) == 0  # both cells are in the log: nothing trains again
    assert len((tmp_path / "quality_report_quick.jsonl").read_text().splitlines()) == 2


def test_trainer_ab_alternates_variants_and_splits_epochs(ab_run):
    p = load(ab_run, "ab_read_ahead")
    assert list(p["summary"]) == ["data.read_ahead_steps=0", "data.read_ahead_steps=4"]
    for runs in p["runs"].values():  # one log record per epoch
        assert [len(r["data_share_by_record"]) for r in runs] == [2]
    assert p["summary"]["data.read_ahead_steps=0"]["vs_first"]["median"] == 1.0


def test_trainer_ab_under_torchrun_counts_the_kernels_share_of_cpu(ab_run):
    p = load(ab_run, "ab_read_ahead")
    assert p["backend"] == "torch"
    for runs in p["runs"].values():
        assert runs[0]["steps"] > 0 and runs[0]["cpu_user_seconds"] > 0
    for variant in p["summary"].values():
        assert 0 < variant["kernel_share_of_cpu"]["median"] < 1


def test_code_ab_runs_the_other_checkouts_code_and_tells_when_the_parameters_differ(
        tiny_features, tmp_path):
    """`before` is a copy of this checkout's package: as it is, both sides end with the same
    parameters; with another default seed (so its code really ran), they do not."""
    before = tmp_path / "before"
    shutil.copytree(Path(code_ab.REPO) / "hvd_ctsm", before / "hvd_ctsm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    args = ["--before", str(before), "--data", str(tiny_features), "--engines", "single",
            "--steps", "3", "--rounds", "1", "--out", str(tmp_path)]
    assert code_ab.main([*args, "--name", "same"]) == 0
    same = load(tmp_path, "code_ab_same")
    assert [c["same_parameters"] for c in same["cells"]] == [True]
    config = before / "hvd_ctsm" / "config" / "__init__.py"
    config.write_text(config.read_text().replace("    seed: int = 0\n", "    seed: int = 1\n"))
    assert code_ab.main([*args, "--name", "seeded"]) == 0
    cell = load(tmp_path, "code_ab_seeded")["cells"][0]
    assert not cell["same_parameters"] and cell["before"]["seconds_per_step"] > 0
    assert report.main(["--results", str(tmp_path), "--out", str(tmp_path / "R.md")]) == 0
    assert "## Two revisions side by side: seeded" in (tmp_path / "R.md").read_text()


def test_backends_trains_under_both_launchers_beside_an_independent_pair(tiny_features, tmp_path):
    """horovodrun, torchrun and two single-rank trainers, once each: both engines train the same
    numbers, and each is compared with the pair of its repeat."""
    assert backends.main(["--data", str(tiny_features), "--config", "default", "--repeats", "1",
                          "--pair", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("backends_*_tiny_1ep.json")
    payload = json.loads(path.read_text())
    runs, summary = payload["runs"], payload["summary"]
    assert [len(runs[k]) for k in ("horovod", "torch", "pair")] == [1, 1, 1]
    assert len(runs["pair"][0]["each"]) == 2
    assert runs["horovod"][0]["steps"] == runs["torch"][0]["steps"] > 0
    assert runs["horovod"][0]["ndcg@10"] == pytest.approx(runs["torch"][0]["ndcg@10"], abs=1e-6)
    for backend in ("horovod", "torch"):
        assert 0 < summary[backend]["efficiency_vs_pair"]["median"] < 2
        assert -1 < summary[backend]["backward_beyond_pair_share"]["median"] < 1


def test_backward_beyond_the_pair_is_a_share_of_the_step():
    run = {"epoch_seconds": 10.0, "steps": 10, "shares": {"backward": 0.5}}  # 0.5 s per step
    pair = {"each": [{"epoch_seconds": 8.0, "steps": 10, "shares": {"backward": 0.5}},
                     {"epoch_seconds": 12.0, "steps": 10, "shares": {"backward": 0.25}}]}
    assert backends.backward_beyond_pair(run, pair) == pytest.approx((0.5 - 0.35) / 1.0)


def test_the_gpu_checks_dry_run_trains_the_trainers_default_item_rows(tiny_features, tmp_path):
    """The GPU check's parity and step parts on the CPU (--cpu-dry-run: the script, not its
    times): every parity check passes on the CPU, as its unit tests do; the shared loss with
    sparse gradients and rows caught up trains and settles finite tables."""
    assert gpu.main(["--data", str(tiny_features), "--out", str(tmp_path), "--cpu-dry-run",
                     "--parts", "parity,steps"]) == 0
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert [r["check"] for r in results["parity"]] == list(gpu_parity.CHECKS)
    assert all(r["ok"] for r in results["parity"]), results["parity"]
    steps = results["steps"]
    lazy = [r for r in steps if r["rows"] == "lazy"]
    assert {r["amp"] for r in lazy} == {"bf16", "off"} and all(r["loss"] == "shared" for r in lazy)
    assert all(r["finite"] and r["settled_finite"] for r in lazy), lazy
    assert all(r["recommend_ok"] and r["recommend_s"] > 0 for r in lazy), lazy
    blocks = [r for r in steps if r.get("block_logits")]  # the larger blocks: finite, same loss
    assert {r["rows"] for r in blocks} == {"dense", "lazy"} and all(r["finite"] for r in blocks)
    # rendered beside the stored GPU run's description (this machine has no GPU to describe)
    stored = json.loads((Path(gpu.__file__).parent / "results/gpu.json").read_text())
    assert any(line.startswith("| 10,000 | shared | off | sparse, caught up |")
               for line in gpu.render({**stored, "steps": steps}))


def test_spark_feature_benchmark_quick(spark, tmp_path):
    assert spark_features.main(["--quick", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "spark_features.json").read_text())
    assert [r["events"] for r in payload["results"]] == [2_000, 4_000]
    assert "Cost ratio" in spark_features.render(payload)


@pytest.mark.usefixtures("scaling_run", "comm_run", "quality_run", "ab_run")
def test_report_renders_every_section(results, tmp_path):
    out = tmp_path / "RESULTS.md"
    assert report.main(["--results", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    for heading in ("## Scaling", "## Horovod vs DDP", "## Input pipeline", "## Quality",
                    "## Trainer side by side: read_ahead"):
        assert heading in text
    assert "Horovod / DDP" in text and "Horovod / independent pair" in text
    assert "(oversubscribed)" not in text  # np=4 is not in quick


def test_quality_verdict_without_x1_is_empty_not_a_crash():
    """`quality.py --variants x2_sqrt,x4_sqrt` crashed at the end (KeyError 'x1') and saved
    nothing; without x1 there is nothing to compare with, and the table is still saved."""
    spread = {"median": 0.2, "min": 0.19, "max": 0.21, "stdev": 0.01, "n": 3, "mean": 0.2}
    assert quality.verdict({"x2_sqrt": {"ndcg@10": spread}}) == {}
    verdict = quality.verdict({"x1": {"ndcg@10": spread}, "x4": {"ndcg@10": spread | {
        "mean": 0.185}}})
    assert verdict["x4"]["in_x1_range"] is False and verdict["x4"]["within_2_stdev"] is True


def test_a_logged_trial_older_than_a_model_setting_counts_as_what_it_trained():
    """A record saved before a model setting existed trained without it: it must match a cell
    that turns the setting off, whatever today's default is."""
    from hvd_ctsm.config import load_config, to_dict

    old = to_dict(load_config(None, ["data.path=x"]))
    del old["model"]["recency_bias"]
    record = {"config": old}
    assert model_search.record_fingerprint(record) == model_search.config_fingerprint(
        ["model.recency_bias=false"])
    assert model_search.record_fingerprint(record) != model_search.config_fingerprint(
        ["model.recency_bias=true"])


def test_a_baseline_trial_logged_before_attention_dropout_existed_still_counts_for_the_preset():
    """The default's attention dropout went to 0 after the baseline's cells were logged; the
    preset keeps the paper's dropout on the attention weights, so those cells still count."""
    from hvd_ctsm.config import load_config, to_dict

    old = to_dict(load_config("sasrec", ["data.path=x"]))
    del old["model"]["attention_dropout"]
    assert model_search.record_fingerprint({"config": old}) == model_search.config_fingerprint(
        ["--config", "sasrec"])
    assert model_search.record_fingerprint({"config": old}) != model_search.config_fingerprint(
        ["--config", "sasrec", "model.attention_dropout=0"])


def test_a_trial_logged_before_the_item_tables_decay_existed_counts_as_trained_without_it():
    from hvd_ctsm.config import load_config, to_dict

    old = to_dict(load_config(None, ["data.path=x"]))
    del old["optim"]["item_weight_decay"]
    assert model_search.record_fingerprint({"config": old}) == model_search.config_fingerprint(
        ["optim.item_weight_decay=null"])
    assert model_search.record_fingerprint({"config": old}) != model_search.config_fingerprint(
        ["optim.item_weight_decay=5"])


def test_a_trial_logged_with_the_full_loss_counts_for_auto_where_auto_picks_it():
    from hvd_ctsm.config import load_config, to_dict
    from hvd_ctsm.model.heads import EXACT_MAX_ITEMS

    full = {"config": to_dict(load_config(None, ["data.path=x", "model.loss=full"]))}
    assert model_search.record_fingerprint(full, items=1682) == model_search.config_fingerprint(
        [], items=1682)
    big = EXACT_MAX_ITEMS + 1
    assert model_search.record_fingerprint(full, items=big) != model_search.config_fingerprint(
        [], items=big)
    assert model_search.record_fingerprint(full) != model_search.config_fingerprint([])


def test_a_trial_logged_without_item_decay_counts_for_auto_where_auto_gives_none(tmp_path):
    from hvd_ctsm.config import load_config, to_dict

    plain = {"config": to_dict(load_config(None, ["data.path=x", "optim.item_weight_decay=null"]))}
    decayed = {"config": to_dict(load_config(None, ["data.path=x", "optim.item_weight_decay=5"]))}
    for record, per_item, counts in ((plain, 58.0, True), (plain, 6.0, False),
                                     (decayed, 6.0, True), (decayed, 58.0, False)):
        assert (model_search.record_fingerprint(record, targets_per_item=per_item)
                == model_search.config_fingerprint([], targets_per_item=per_item)) is counts
    # data whose targets per item are unknown: 'auto' matches no resolved trial
    assert model_search.record_fingerprint(plain) != model_search.config_fingerprint([])
    facts = tmp_path / "dataset_facts.json"
    facts.write_text('{"short": {"train_targets_per_item": 6.2}}')
    datasets = {"short": ("synthetic:x", []), "other": ("synthetic:y", [])}
    assert quality_report.known_targets_per_item(datasets, tmp_path / "work", facts) == {
        "short": 6.2, "other": None}


def test_a_failed_benchmark_keeps_its_work_folder_for_the_logs(capsys):
    from benchmarks.common import work_folder

    with work_folder("bench-test-") as done:
        (done / "run.log").write_text("fine")
    assert not done.exists()
    with pytest.raises(RuntimeError), work_folder("bench-test-") as failed:
        (failed / "run.log").write_text("the error")
        raise RuntimeError("a run exited 1")
    assert (failed / "run.log").read_text() == "the error"
    assert str(failed) in capsys.readouterr().err
    shutil.rmtree(failed)


def test_the_quality_report_keeps_to_the_seeds_it_reports(monkeypatch):
    # Every record matches the cell's config here; only the seed may leave one out.
    monkeypatch.setattr(model_search, "record_fingerprint",
                        lambda record, items=None, targets_per_item=None: "cell")
    logged = [{"data": "d", "ranks": quality_report.RANKS, "seed": seed} for seed in (0, 1, 3)]
    assert sorted(quality_report.matching(logged, "d", "cell", (0, 1, 2))) == [0, 1]


def test_model_search_runs_trials_at_once_under_torchrun(tiny_features, tmp_path):
    """Two trials at once under torchrun (as on a GPU machine without Horovod), each logged with
    its launcher; the model a stopped trial would be backtested with (its best checkpoint) is
    the model the trainer keeps."""
    log, work = tmp_path / "search.jsonl", tmp_path / "work"
    assert model_search.main(["--data", str(tiny_features), "--launcher", "torchrun",
                              "--jobs", "2", "--seeds", "0,1", "--trial", "t=epochs=1",
                              "--log", str(log), "--work", str(work)]) == 0
    records = [json.loads(line) for line in log.open()]
    assert sorted(r["seed"] for r in records) == [0, 1]
    assert all(r["launcher"] == "torchrun" and "stopped" not in r for r in records)
    assert {r["config"]["out"] for r in records} == {"t-s0", "t-s1"}  # no machine's paths
    import torch

    kept = work / "t-s0" / "model.pt"
    trained = torch.load(kept, weights_only=False)
    kept.unlink()
    model_search.model_from_checkpoint(work / "t-s0", tiny_features)
    rebuilt = torch.load(kept, weights_only=False)
    assert rebuilt["sizes"] == trained["sizes"] and rebuilt["config"] == trained["config"]
    assert all(torch.equal(rebuilt["model"][k], v) for k, v in trained["model"].items())


def test_a_trial_stopped_for_time_is_stopped_with_its_launchers_workers(tmp_path):
    started = tmp_path / "child.pid"
    child = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); " \
            f"open('{started}', 'w').write(str(p.pid)); time.sleep(60)"
    seconds, stopped = run_until([sys.executable, "-c", child],
                                              tmp_path / "run.log", timeout=3)
    assert stopped and seconds < 40
    stat = Path(f"/proc/{started.read_text()}/stat")
    for _ in range(50):  # the launcher's child went with it (gone, or a zombie nobody reaped)
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the launcher's child outlived the stop")


def test_the_shared_negatives_count_tells_trials_apart_only_where_the_shared_loss_trains():
    from hvd_ctsm.config import load_config, to_dict

    logged = {"config": to_dict(load_config(None, ["data.path=x", "model.shared_negatives=2048"]))}
    assert model_search.record_fingerprint(logged, items=1682) == model_search.config_fingerprint(
        ["model.shared_negatives=1024"], items=1682)
    shared = {"config": to_dict(load_config(None, ["data.path=x", "model.loss=shared",
                                                   "model.shared_negatives=2048"]))}
    assert model_search.record_fingerprint(shared) != model_search.config_fingerprint(
        ["model.loss=shared", "model.shared_negatives=1024"])
    assert model_search.record_fingerprint(logged, items=10**6) != model_search.config_fingerprint(
        ["model.shared_negatives=1024"], items=10**6)
