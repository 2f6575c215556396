"""One command, `hvd-ctsm STEP`: every step reachable, each its module's own main(argv).
This file holds the unit-tier part; the rest is in tests/integration/test_cli.py."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from hvd_ctsm import cli
from hvd_ctsm.errors import EXIT_CODES
from tests.conftest import REPO, RUN_SH_ENV

STEPS = ["features", "train", "backtest", "gate", "deploy", "score", "pipeline", "doctor", "bench"]


def test_help_lists_every_step(capsys):
    assert cli.main(["--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert listed == STEPS


def test_an_unknown_step_is_refused_naming_the_steps(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown step 'trian'" in err and "features, train, backtest" in err
    assert cli.main([]) == 2  # no step: bad arguments (it printed the usage and exited 0)
    assert "name a step" in capsys.readouterr().err


@pytest.mark.parametrize("step", [s for s in STEPS if s != "bench"])
def test_every_step_answers_help_with_its_own_options(step, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([step, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and EXIT_CODES in out  # every step's help ends with the one table


def test_train_prints_the_resolved_config_and_refuses_a_bad_value_before_starting(tmp_path,
                                                                                   capsys):
    assert cli.main(["train", "--config", "ml100k", "optim.lr=1e-3", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["optim"]["lr"] == 0.001
    with pytest.raises(SystemExit, match="error: config: epochs=3.7 has the wrong type"):
        cli.main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "epochs=3.7"])
    assert not (tmp_path / "run").exists()


def test_gate_runs_the_gate_step(tmp_path):
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"model": {"full": {"ndcg@10": 0.12}}}))
    assert cli.main(["gate", "--report", str(report), "--gate", "ndcg@10>=0.1"]) == 0
    assert json.loads(report.read_text())["gate"]["passed"] is True
    assert cli.main(["gate", "--report", str(report), "--gate", "ndcg@10>=0.2"]) == 1


def test_bench_in_a_checkout_runs_the_benchmarks_under_its_own_name():
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm", "bench", "--help"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: hvd-ctsm bench [-h]")


def test_bench_outside_a_checkout_says_where_to_run_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm", "bench", "--help"], cwd=tmp_path,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "run it from the root of a checkout" in proc.stderr


def test_bad_input_through_the_console_script_is_one_line_and_exit_2(tmp_path):
    """Before: `hvd-ctsm backtest` with a missing dataset printed a traceback and exit 1."""
    missing = tmp_path / "no-such-features"
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm", "backtest", "--data", str(missing),
                           "--model", str(tmp_path / "model"), "--report",
                           str(tmp_path / "report.json")], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"hvd-ctsm backtest: error: {missing} is not a folder: point "
                                   "--data at a folder written by spark_jobs.build_features")


def test_version_names_the_installed_release(capsys):
    from importlib import metadata

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hvd-ctsm {metadata.version('hvd_ctsm')}"


def test_the_feature_job_refuses_its_output_before_starting_spark(tmp_path, monkeypatch, capsys):
    """An --out the job may not write is exit 2 (bad input, as for every program) and costs no
    Spark start (before: exit 1 after about 10 s of Spark)."""
    import spark_jobs.session
    from spark_jobs.build_features import main

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("years of work")
    monkeypatch.setattr(spark_jobs.session, "get_spark",
                        lambda **kwargs: pytest.fail("Spark started before the output check"))
    source = ["--source", "synthetic:clients=10,items=5,events=50"]
    # A folder we did not write: the same refusal with or without --overwrite (before: "exists;
    # pass --overwrite", then a refusal when the user did)
    for extra in ([], ["--overwrite"]):
        assert main([*source, "--out", str(theirs), *extra]) == 2
        assert "not written by hvd_ctsm" in capsys.readouterr().err
    assert (theirs / "notes.txt").read_text() == "years of work"


@pytest.mark.parametrize("error, code", [(IsADirectoryError("a folder where a file goes"), 2),
                                         (KeyError("items"), 2), (RuntimeError("a bug"), 3)])
def test_the_feature_job_sorts_errors_as_every_program_does(tmp_path, monkeypatch, capsys,
                                                           error, code):
    """The feature job and errors.run_cli share one table of bad input (exit 2, one line); a
    crash is one line and exit 3 too (before: a KeyError or IsADirectoryError was a traceback)."""
    import spark_jobs.session
    from spark_jobs.build_features import cli

    def fail(**kwargs):
        raise error

    monkeypatch.setattr(spark_jobs.session, "get_spark", fail)
    argv = ["--source", "synthetic:clients=10,items=5,events=50", "--out", str(tmp_path / "o")]
    monkeypatch.setattr(sys, "argv", ["build_features.py", *argv])
    with pytest.raises(SystemExit) as stop:
        cli()
    assert stop.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("hvd-ctsm features: ") and len(err.strip().splitlines()) == 1, err


JVM_STOPPED = ("An error occurred while calling o260.unpersist. : java.lang.IllegalStateException: "
               "Cannot call methods on a stopped SparkContext. This stopped SparkContext was "
               "created at: org.apache.spark.api.java.JavaSparkContext.<init>(...)")
JVM_OOM = ("An error occurred while calling o251.save. : org.apache.spark.SparkException: Job "
           "aborted due to stage failure: Task 1 in stage 43.0 failed 1 times: "
           "java.lang.OutOfMemoryError: Java heap space")


def raised_during(first: Exception, second: Exception) -> Exception:
    """`second` as Python raises it from a finally block while `first` propagates."""
    try:
        try:
            raise first
        finally:
            raise second
    except Exception as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize("error, says", [
    (RuntimeError(JVM_OOM), "the Spark JVM ran out of memory"),
    (raised_during(RuntimeError(JVM_OOM), RuntimeError(JVM_STOPPED)),
     "the Spark JVM ran out of memory"),
    (RuntimeError(JVM_STOPPED), "the Spark JVM stopped mid-job, most often out of memory")])
def test_a_spark_jvm_out_of_memory_is_one_line_naming_the_heap_setting(capsys, error, says):
    """The texts are Py4J's own (the JVM cannot be made to run out of memory in a unit test)."""
    from hvd_ctsm.errors import run_cli

    def main(argv):
        raise error

    assert run_cli(main, "hvd-ctsm-features", []) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert "--conf spark.driver.memory=16g" in err and "JavaSparkContext" not in err


def fails_with(error: BaseException):
    """A program's main that raises `error`."""
    def main(argv):
        raise error
    return main


def test_a_failed_program_leaves_its_exit_code_for_run_sh(tmp_path, monkeypatch, capsys):
    """Under run.sh's launchers each worker's code is read from HVD_CTSM_EXIT_CODE_DIR (torchrun
    and horovodrun exit 1 whatever it was): bad input 2, a crash 3, argparse's exit 2, bad input
    let through by --debug; a program that succeeds, or runs without the variable, writes
    nothing."""
    from hvd_ctsm.errors import EXIT_CODE_DIR, run_cli

    monkeypatch.delenv(EXIT_CODE_DIR, raising=False)
    assert run_cli(fails_with(ValueError("bad")), "p", []) == 2
    for error, code in [(ValueError("bad"), 2), (RuntimeError("bug"), 3)]:
        folder = tmp_path / str(code)
        folder.mkdir()
        monkeypatch.setenv(EXIT_CODE_DIR, str(folder))
        assert run_cli(fails_with(error), "p", []) == code
        assert [f.read_text() for f in folder.iterdir()] == [f"{code}\n"]
    for name, error, argv in [("argparse", SystemExit(2), []),
                              ("debug", ValueError("bad"), ["--debug"])]:  # raised, recorded
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.setenv(EXIT_CODE_DIR, str(folder))
        with pytest.raises(type(error)):
            run_cli(fails_with(error), "p", argv)
        assert [f.read_text() for f in folder.iterdir()] == ["2\n"]
    folder = tmp_path / "ok"
    folder.mkdir()
    monkeypatch.setenv(EXIT_CODE_DIR, str(folder))
    assert run_cli(lambda argv: 0, "p", []) == 0
    assert not list(folder.iterdir())
    capsys.readouterr()


def test_debug_holds_for_its_own_call_only():
    """--debug shows what a call would otherwise keep back (Spark's log of a job that filled
    the disk) for that call: before, it stayed set for the rest of the process, so a notebook's
    later calls without it kept Spark's log too."""
    from hvd_ctsm.errors import DEBUG, run_cli

    seen = []
    assert run_cli(lambda argv: seen.append(DEBUG.is_set()) or 0, "p", ["--debug"]) == 0
    with pytest.raises(ValueError):
        run_cli(fails_with(ValueError("bad")), "p", ["--debug"])
    assert run_cli(lambda argv: seen.append(DEBUG.is_set()) or 0, "p", []) == 0
    assert seen == [True, False]


def test_resume_starts_from_the_runs_own_settings(tmp_path, capsys):
    """--resume continues a run as it was set up (its config.yaml), the command's overrides on
    top; before, `--resume` alone ran on the defaults (100 epochs, early stopping on) and
    rewrote the run's config.yaml without a word. A new run keeps the defaults."""
    from hvd_ctsm.config import config_from_argv, save_config
    from hvd_ctsm.train.launch import main

    run = tmp_path / "run"
    run.mkdir()
    cfg, _ = config_from_argv(["--data", "d", "--out", str(run), "epochs=12",
                               "early_stop_evals=0"])
    save_config(cfg, run / "config.yaml")

    def printed(*argv) -> dict:
        assert main(["--data", "d", "--out", str(run), "--print-config", *argv]) == 0
        return yaml.safe_load(capsys.readouterr().out)

    resumed = printed("--resume")
    assert (resumed["epochs"], resumed["early_stop_evals"]) == (12, 0)
    resumed = printed("--resume", "epochs=20")
    assert (resumed["epochs"], resumed["early_stop_evals"]) == (20, 0)
    new = printed()
    default, _ = config_from_argv(["--data", "d"])
    assert (new["epochs"], new["early_stop_evals"]) == (default.epochs, default.early_stop_evals)


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    """KeyboardInterrupt, with a step's own message (the trainer's says how to go on) or
    none: one line, exit 130 (before: the traceback, exit 1)."""
    from hvd_ctsm.errors import EXIT_INTERRUPTED, run_cli

    for error, says in [(KeyboardInterrupt(), "interrupted"),
                        (KeyboardInterrupt("go on with X"), "go on with X")]:
        assert run_cli(fails_with(error), "p", []) == EXIT_INTERRUPTED == 130
        assert capsys.readouterr().err == f"p: {says}\n"


def test_run_sh_takes_relative_paths_from_where_it_is_run(tmp_path):
    """run.sh works from its checkout, and relative paths once named files there: `cd runs &&
    ../run.sh gate --report r1.json` said r1.json was not found."""
    report = {"model": {"full": {"ndcg@10": 0.2}}, "gate": {"passed": None, "checks": []}}
    (tmp_path / "r1.json").write_text(json.dumps(report))
    proc = subprocess.run([str(REPO / "run.sh"), "gate", "--report", "r1.json", "--gate",
                           "ndcg@10>=0.1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **RUN_SH_ENV})
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r1.json").read_text())["gate"]["passed"] is True


def test_an_elastic_setting_it_does_not_take_is_refused_before_overwrite_empties_the_run(
        tmp_path):
    """`--elastic --overwrite dist.backward_passes_per_step=2` into a finished run: the run
    folder was emptied, then the elastic loop refused the setting (the run was lost)."""
    from hvd_ctsm.files import outputs

    run = tmp_path / "run"
    run.mkdir()
    outputs.mark(run, "run")
    (run / "model.pt").write_bytes(b"a finished run's model")
    with pytest.raises(SystemExit) as refused:
        cli.main(["train", "--data", str(tmp_path / "data"), "--out", str(run), "--elastic",
                  "--overwrite", "dist.backward_passes_per_step=2"])
    assert "--elastic" in str(refused.value)  # the setting, or (current stack) Horovod itself
    assert (run / "model.pt").read_bytes() == b"a finished run's model"


@pytest.mark.parametrize("flag", ["--num-proc", "--epochs", "--max-len"])
def test_the_estimators_counts_are_whole_numbers_from_one(flag, tmp_path, capsys):
    """--num-proc 0 crashed in Spark, --epochs 0 after 20 s in mpirun, --max-len 0 in torch
    (each exit 3); now argparse's one line and exit 2, before Spark starts."""
    from hvd_ctsm.train import estimator

    with pytest.raises(SystemExit) as refused:
        estimator.main(["--data", str(tmp_path), "--store", str(tmp_path / "s"), "--out",
                        str(tmp_path / "o"), flag, "0"])
    assert refused.value.code == 2
    assert f"argument {flag}: expected a whole number >= 1, got '0'" in capsys.readouterr().err


def test_a_reader_that_stops_reading_is_no_crash():
    """`hvd-ctsm pipeline --help | head` ended in 'hvd-ctsm: crashed: BrokenPipeError'. Now it
    is silent, with the shell's code for a command the pipe stopped (141)."""
    lines = ("import sys; from hvd_ctsm.errors import run_cli; "
             "sys.exit(run_cli(lambda argv: print('line\\n' * 10**6) or 0, 'hvd-ctsm'))")
    proc = subprocess.Popen([sys.executable, "-c", lines], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline() == b"line\n"
    proc.stdout.close()  # as `head -1` does
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


def test_a_worker_gone_before_horovodrun_stops_it_prints_no_traceback(capfd, monkeypatch):
    """horovodrun stops its workers from threads that ask psutil for a worker's children; one
    already gone raised psutil.NoSuchProcess, and its thread's traceback stood in a Ctrl-C's one
    line (CI, twice: the second time after horovodrun had returned, when the hook was only
    installed around it). Any other error of a thread is still shown."""
    import threading

    import psutil

    from hvd_ctsm.distributed.launchers import hide_gone_workers

    # Python's own hook, as in horovodrun's process (pytest's turns them into warnings); put
    # back after the test by monkeypatch
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    def raises(error: Exception) -> None:
        def run():
            raise error
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()

    raises(psutil.NoSuchProcess(10883))  # before: printed
    assert "NoSuchProcess" in capfd.readouterr().err
    hide_gone_workers()
    raises(psutil.NoSuchProcess(10883))
    assert capfd.readouterr().err == ""
    raises(OSError("another error"))
    assert "OSError: another error" in capfd.readouterr().err
