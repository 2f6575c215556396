"""The torch.distributed backend beside Horovod: real torchrun workers (DDP over Gloo), the real
trainer entry point, and runs that move between the two backends.

The two backends train the same numbers: a run stopped under one and resumed under the other ends
with the model an uninterrupted run ends with, bit for bit, and writes the same run folder.
This file holds the unit-tier part; the rest is in tests/integration/test_torch_backend.py."""

import sys
import tempfile
from pathlib import Path

import pytest

from hvd_ctsm.distributed import BackendError, parse_selftest, resolve
from hvd_ctsm.distributed.torch_backend import remove_torchrun_log_folders
from tests.helpers import faultlib as fl

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def torchrun(*flags: str) -> list[str]:
    return [TORCHRUN, "--standalone", "--nproc-per-node", "2", *flags]


TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}


@pytest.mark.parametrize("choice, env, horovod, want", [
    ("auto", TORCHRUN_ENV, True, "torch"),
    ("auto", {"HOROVOD_RANK": "0"}, True, "horovod"),
    ("auto", {}, True, "horovod"),
    ("auto", {}, False, "single"),
    ("torch", {}, True, "torch"),
    ("horovod", {"OMPI_COMM_WORLD_RANK": "1"}, True, "horovod"),
])
def test_auto_picks_torch_under_torchrun_else_horovod_else_one_process(choice, env, horovod,
                                                                      want):
    assert resolve(choice, env, horovod_installed=horovod) == want


@pytest.mark.parametrize("choice, env, horovod, message", [
    ("horovod", TORCHRUN_ENV, True, "torchrun started this worker"),
    ("horovod", {}, False, "Horovod is not installed"),
    ("torch", {"HOROVOD_RANK": "0"}, True, "horovodrun started this worker"),
    ("mpi", {}, True, "is not one of"),
])
def test_a_backend_that_cannot_serve_the_launch_says_how_to_fix_it(choice, env, horovod, message):
    with pytest.raises(BackendError, match=message):
        resolve(choice, env, horovod_installed=horovod)


def test_torchrun_selftest_gives_the_exact_sum_on_both_ranks_and_leaves_no_folder(
        tmp_path, monkeypatch):
    """torchrun without --log-dir (as TorchDistributor starts it on every executor) left an
    empty torchelastic_* tree in the temporary folder at each run; the ranks remove it now."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.delenv("PET_LOG_DIR", raising=False)  # torchrun's --log-dir, if set
    proc = fl.run(torchrun("-m", "hvd_ctsm.distributed", "selftest"), timeout=180,
                  TMPDIR=str(temp))
    reports = parse_selftest(proc.stdout)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        assert r["backend"] == "torch" and r["size"] == 2
        assert r["sum"] == [10.0, 12.0, 14.0, 16.0]
    assert list(temp.iterdir()) == []


def test_ranks_that_fail_leave_no_torchrun_folder_either(tmp_path, monkeypatch):
    """Both ranks end with an error code through exit_process, without a shutdown."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.delenv("PET_LOG_DIR", raising=False)
    fails = ("from hvd_ctsm import distributed as dist; dist.start('auto', threads_per_rank=1); "
             "dist.exit_process(3)")
    proc = fl.run(torchrun("--no-python", sys.executable, "-c", fails), timeout=180,
                  check=False, TMPDIR=str(temp))
    assert proc.returncode != 0 and "exitcode: 3" in proc.stderr, proc.stderr[-2000:]
    assert list(temp.iterdir()) == [], proc.stderr[-2000:]


def torchrun_log_tree(root: Path, ranks: int = 2) -> list[dict]:
    """torchrun's folders for one attempt under root; each rank's environment's error file."""
    attempt = root / "run_abc" / "attempt_0"
    for rank in range(ranks):
        (attempt / str(rank)).mkdir(parents=True)
    return [{"TORCHELASTIC_ERROR_FILE": str(attempt / str(r) / "error.json")}
            for r in range(ranks)]


def test_the_last_rank_out_removes_torchruns_tree_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    envs = torchrun_log_tree(tmp_path / "torchelastic_x1")
    remove_torchrun_log_folders(envs[0])
    assert sorted(p.name for p in tmp_path.glob("torchelastic_x1/run_abc/attempt_0/*")) == ["1"]
    remove_torchrun_log_folders(envs[1])
    assert list(tmp_path.iterdir()) == []
    # a failure's error.json stays, with every folder above it
    envs = torchrun_log_tree(tmp_path / "torchelastic_x2")
    Path(envs[1]["TORCHELASTIC_ERROR_FILE"]).write_text("{}")
    remove_torchrun_log_folders(envs[0])
    remove_torchrun_log_folders(envs[1])
    assert [p.name for p in tmp_path.rglob("*.json")] == ["error.json"]
    # a --log-dir the user chose keeps even its empty folders
    envs = torchrun_log_tree(tmp_path / "my_logs")
    for env in envs:
        remove_torchrun_log_folders(env)
    assert sorted(p.name for p in (tmp_path / "my_logs/run_abc/attempt_0").iterdir()) == ["0", "1"]
    remove_torchrun_log_folders({})  # not under torchrun: nothing to do


def test_torchrun_workers_exit_with_their_code_after_their_exit_handlers_skipping_teardown(
        tmp_path):
    """Gloo's threads outlive destroy_process_group (distributed.exit_process): a torchrun
    worker must not reach the interpreter's teardown with them, but must run its exit handlers
    (MLflow ends its runs there). Without torchrun nothing is skipped."""
    worker = str(Path(__file__).parents[1] / "helpers" / "exit_worker.py")
    launched = tmp_path / "torchrun"
    launched.mkdir()
    proc = fl.run(torchrun("--no-python", sys.executable, worker, str(launched), "0"),
                  timeout=180)
    assert sorted(p.name for p in launched.iterdir()) == ["atexit-0", "atexit-1"], proc.stderr
    alone = tmp_path / "alone"
    alone.mkdir()
    proc = fl.run([sys.executable, worker, str(alone), "4"], timeout=180, check=False)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert sorted(p.name for p in alone.iterdir()) == ["atexit-0", "teardown-0"]


@pytest.mark.parametrize("route", ["torch_estimator", "spark_store", "spark_run"])
def test_a_horovod_route_without_horovod_is_one_line_naming_the_classic_stack(route):
    """Where Horovod is not installed (the current stack; its unit tier runs this), the routes
    only Horovod serves stop with one line and exit 2, naming the classic stack and the torch
    route to use instead."""
    import importlib.util

    from hvd_ctsm.distributed import horovod_backend
    from hvd_ctsm.errors import exit_code_for

    if importlib.util.find_spec("horovod") is not None:
        pytest.skip("Horovod is installed (the classic stack): the current stack runs this")
    call = {"torch_estimator": lambda: horovod_backend.torch_estimator(),
            "spark_store": lambda: horovod_backend.spark_store("/tmp/store"),
            "spark_run": lambda: horovod_backend.spark_run(print, (), 2, None, None, False)}
    with pytest.raises(horovod_backend.HorovodNotInstalled, match="needs Horovod, which is not "
                       "installed here .* use the classic stack") as info:
        call[route]()
    assert exit_code_for(info.value) == 2
    assert "TorchDistributor" in str(info.value)  # what the current stack trains with instead


def test_making_the_optimizers_state_leaves_the_weights_even_with_weight_decay():
    """On a resume only rank 0 reads the optimizer's state; the others make theirs after the
    weights were broadcast, and that step must not decay them (the ranks would differ)."""
    import torch

    from hvd_ctsm.distributed.base import create_optimizer_state

    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW([{"params": [model.weight], "weight_decay": 5.0},
                                   {"params": [model.bias]}], lr=0.1, weight_decay=0.1)
    create_optimizer_state(optimizer)
    assert optimizer.state_dict()["state"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert [g["weight_decay"] for g in optimizer.param_groups] == [5.0, 0.1]


def test_broadcast_state_gives_every_rank_rank_0s_optimizer_state_whatever_theirs_was(tmp_path):
    """On a resume only rank 0 read the checkpoint. After broadcast_state every rank's optimizer
    state is rank 0's: its settings, its values, its tensors' data, dtype and place, its keys
    and no other (a key only another rank had is gone, a tensor of another dtype is remade)."""
    import json

    worker = str(Path(__file__).parents[1] / "helpers" / "optimizer_state_worker.py")
    proc = fl.run(torchrun("--no-python", sys.executable, worker, str(tmp_path)), timeout=180)
    read = {path.stem: json.loads(path.read_text()) for path in tmp_path.glob("*.json")}
    assert sorted(read) == ["after-0", "after-1", "before-0", "before-1"], proc.stderr[-2000:]
    assert read["before-1"] != read["before-0"]  # the case is not trivial
    assert read["after-0"] == read["before-0"]
    assert read["after-1"] == read["before-0"]


def test_the_sparse_comm_hook_averages_as_ddps_own_sparse_allreduce_does(tmp_path):
    """NCCL has no sparse allreduce, so on a GPU sparse_allgather_hook gathers each rank's rows:
    here, under torchrun over Gloo (no GPU here to run NCCL), its averaged gradients equal
    those of Gloo's own sparse allreduce, step by step, with uneven row counts and rows that
    both ranks touch; both ranks hold the same, and the embedding's gradient stays sparse."""
    import json

    import torch

    worker = str(Path(__file__).parents[1] / "helpers" / "sparse_hook_worker.py")
    proc = fl.run(torchrun("--no-python", sys.executable, worker, str(tmp_path)), timeout=180)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)
             if (tmp_path / f"rank-{r}.json").exists()]
    assert len(ranks) == 2, proc.stderr[-2000:]
    assert ranks[0] == ranks[1]
    for own, hooked in ranks[0]:
        assert own["item_sparse"] and hooked["item_sparse"]
        assert any(any(row) for row in own["item"])
        for name in ("item", "out"):
            torch.testing.assert_close(torch.tensor(hooked[name]), torch.tensor(own[name]))


def test_the_drivers_view_of_torchrun_agents_leaves_out_only_the_exit_barrier_race(monkeypatch):
    """torch's exit barrier race (its issue 69520) logged a traceback after every worker had
    finished; on the driver it followed a rank's one-line error and read as a crash (CI, stop
    76). The lines around it, another error of the agent's, and a partial line stay."""
    import io

    from hvd_ctsm.distributed.torch_spark import exit_barrier_race_unsaid

    at = "E1202 07:22:37.391000 13414 site-packages/torch/distributed/elastic/agent/server/api.py"
    race = [f"{at}:1008] Error waiting on exit barrier. Elapsed: 0.01 seconds\n",
            f"{at}:1008] Traceback (most recent call last):\n",
            f'{at}:1008]   File "api.py", line 994, in _exit_barrier\n',
            f"{at}:1008] torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.\n"]
    other = f"{at}:720] failed (exitcode: -9) local_rank: 0 (pid: 13420) of binary: python\n"
    seen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", seen)
    with exit_barrier_race_unsaid(sys, "stderr"):
        sys.stderr.write("hvd-ctsm train: error: no space left on device\n")
        for line in race:  # as pyspark's log server writes them: a line a write
            sys.stderr.write(line)
        sys.stderr.write("epoch 1 50%\r")
        sys.stderr.write("".join([other, *race, "done\n"]))
        assert sys.stderr.fileno == seen.fileno  # the rest is the stream's own
    assert sys.stderr is seen
    assert seen.getvalue() == ("hvd-ctsm train: error: no space left on device\n"
                               f"epoch 1 50%\r{other}done\n")
