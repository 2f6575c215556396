"""One command, `hvd-ctsm STEP`: every step reachable, each its module's own main(argv).
The unit-tier part is in tests/unit/test_cli.py."""

import os
import shutil
import subprocess

import pytest

from hvd_ctsm import cli
from tests.conftest import REPO


def test_train_check_starts_nothing_and_removes_nothing(tiny_features, tmp_path, capsys):
    """--check makes every check a rank makes first, --overwrite's included, and touches
    nothing: the run folder --overwrite would replace is still there afterwards."""
    from hvd_ctsm.files import outputs

    run = tmp_path / "run"
    run.mkdir()
    outputs.mark(run, "run")
    (run / "train_log.jsonl").write_text("{}\n")
    args = ["train", "--data", str(tiny_features), "--out", str(run), "--check"]
    with pytest.raises(SystemExit, match="already holds a run: pass --resume"):
        cli.main(args)
    assert cli.main([*args, "--overwrite"]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {tiny_features} -> {run}"
    assert (run / "train_log.jsonl").read_text() == "{}\n"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_run_sh_train_checks_once_before_any_launcher_starts(backend, tiny_features, tmp_path):
    """A bad value or a missing dataset under ./run.sh train: one line and exit 2, from the one
    check before torchrun or horovodrun starts (before: the line once per rank, then torchrun's
    43-line ChildFailedError or Horovod's 31 lines, and exit 1). Bad NP values likewise (before:
    horovodrun ran nothing for NP=0 and exited 0; torchrun's traceback and 1 for NP=abc; more
    ranks than row groups passed the check, then every rank said so)."""
    env = {**os.environ, "NP": "2", "BACKEND": backend}
    features = tmp_path / "features"
    features.mkdir()
    cases = {"epochs=1.5 has the wrong type": ["--data", str(features), "epochs=1.5"],
             "is not a folder": ["--data", str(tmp_path / "no-such-features")],
             "metadata.json not found": ["--data", str(features)],
             "8 row groups, fewer than 9 ranks": ["NP=9", "--data", str(tiny_features)],
             "NP=0: the number of training ranks": ["NP=0", "--data", str(tiny_features)],
             "NP=abc: the number of training ranks": ["NP=abc", "--data", str(tiny_features)]}
    for says, args in cases.items():
        np_ = [a.removeprefix("NP=") for a in args if a.startswith("NP=")]
        args = [a for a in args if not a.startswith("NP=")]
        proc = subprocess.run(["./run.sh", "train", *args, "--out", str(tmp_path / "run")],
                              cwd=REPO, capture_output=True, text=True, timeout=300,
                              env=env | {"NP": (np_ or ["2"])[0]})
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "run").exists()




@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_run_sh_train_exits_with_its_workers_code_not_the_launchers(backend, tiny_features,
                                                                    tmp_path):
    """A dataset with a validation Parquet file deleted passes the check before launch (it
    reads the metadata and the training split's files) and is refused by every worker, exit 2:
    ./run.sh train exits 2 too (before: the launcher's 1, which the exit table reads as
    "refused by a gate", after its traceback)."""
    data = tmp_path / "damaged"
    shutil.copytree(tiny_features, data)
    sorted((data / "validation").glob("*.parquet"))[1].unlink()
    env = {**os.environ, "NP": "2", "BACKEND": backend}
    proc = subprocess.run(["./run.sh", "train", "--data", str(data), "--out", str(tmp_path / "run"),
                           "epochs=1"], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "is missing" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    launcher = {"torch": "torchrun", "horovod": "horovodrun"}[backend]
    assert proc.stderr.strip().splitlines()[-1] == \
        f"{launcher}: a worker stopped: bad input (exit 2); its message is above"
