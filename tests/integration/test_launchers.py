"""./run.sh's launchers run in one process (hvd_ctsm.distributed.launchers): a run whose workers
failed ends in one line and the exit code of the errors table its workers mean, under real
torchrun (both stacks) and horovodrun. The workers are tiny scripts that end through run_cli as
every program does, or are killed as the kernel's OOM killer would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.both_stacks, pytest.mark.slow]

WORKER = """
import os, signal, sys, time
from hvd_ctsm.errors import run_cli
rank = int(os.environ.get("RANK") or os.environ["HOROVOD_RANK"])
action = sys.argv[1 + rank]

def ready():  # the test signals the launcher only once both ranks are here
    open(f"ready-{rank}", "w").close()

def main(argv):
    if action == "bad":
        raise ValueError("this rank's input is bad")
    if action == "bug":
        raise RuntimeError("a bug")
    if action == "wait":
        ready()
        time.sleep(120)
    if action == "note":  # as the trainer does: a line before SIGTERM ends it
        from hvd_ctsm.errors import launcher_stopped_by
        from hvd_ctsm.train.faults import note_on_sigterm
        with note_on_sigterm(lambda: f"rank {rank}: launcher stopped by {launcher_stopped_by()}"):
            ready()
            time.sleep(120)
    if action == "killed":  # after the other rank's end: a failed one's code is written first
        failing = sys.argv[2 - rank] in ("bad", "bug")
        folder, deadline = os.environ["HVD_CTSM_EXIT_CODE_DIR"], time.time() + 60
        while failing and not os.listdir(folder) and time.time() < deadline:
            time.sleep(0.1)  # (a fixed 2 s could end first on a loaded machine)
        time.sleep(0 if failing else 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return 0

sys.exit(run_cli(main, f"rank {rank}"))
"""

# (each rank's action, the run's exit code, what the last line says it means)
CASES = [(("ok", "ok"), 0, None), (("bad", "killed"), 2, "bad input"),
         (("ok", "bug"), 3, "crashed"), (("killed", "ok"), 3, "crashed")]


def launcher_command(launcher: str, worker: str, actions) -> list[str]:
    args = {"torchrun": ["--standalone", "--nproc-per-node", "2", worker],
            "horovodrun": ["-np", "2", "--gloo", sys.executable, worker]}[launcher]
    return [sys.executable, "-m", "hvd_ctsm.distributed.launchers", launcher, *args, *actions]


@pytest.mark.parametrize("launcher", ["torchrun",
                                      pytest.param("horovodrun", marks=pytest.mark.horovod)])
def test_a_failed_run_ends_in_one_line_with_the_code_its_workers_mean(launcher, tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # horovodrun takes 6 s a launch: bad input beside a killed rank, and a killed rank alone
    cases = CASES if launcher == "torchrun" else [CASES[1], CASES[3]]
    for actions, code, meaning in cases:
        proc = subprocess.run(launcher_command(launcher, str(worker), actions), cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == code, (actions, proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr, (actions, proc.stderr[-3000:])
        if meaning:
            last = proc.stderr.strip().splitlines()[-1]
            assert last == f"{launcher}: a worker stopped: {meaning} (exit {code}); its " \
                           "message is above", (actions, proc.stderr[-3000:])
        assert not list(tmp_path.glob("hvd_ctsm-exit-codes-*"))


@pytest.mark.parametrize("launcher", ["torchrun",
                                      pytest.param("horovodrun", marks=pytest.mark.horovod)])
def test_ctrl_c_ends_the_run_in_one_line_and_130(launcher, tmp_path):
    """SIGINT to the launcher (as Ctrl-C sends it): before, about 120 lines with three
    tracebacks (the launcher's and each rank's) and exit 1 (torchrun) or 3 (horovodrun).
    horovodrun SIGTERMs its workers, and a worker that says why (the trainer does) knows it was
    the launcher's SIGINT: it said a rank had failed."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = subprocess.Popen(launcher_command(launcher, str(worker), ["note", "wait"]),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    # Both ranks are in place (a fixed 8 s wait could end before a loaded machine's horovodrun
    # had started them and the trainer's note was set: the line below would then be missing).
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"{launcher}: stopped by SIGINT", err[-3000:]
    # torchrun passes SIGINT on (the ranks' KeyboardInterrupt); horovodrun sends SIGTERM
    said = "rank 0: interrupted" if launcher == "torchrun" else \
        "rank 0: launcher stopped by SIGINT"
    assert said in err, err[-3000:]


@pytest.mark.horovod
def test_horovodruns_middlemen_start_through_the_hook_and_still_run_the_command(monkeypatch,
                                                                                 capfd):
    """horovodrun runs each worker's command from a middleman made by 'spawn', without the
    launcher's hook that hides a gone worker's psutil.NoSuchProcess: its traceback stood among
    a Ctrl-C's lines. The middleman now starts through ours, which must still run the command
    and pass on its output and exit code (the race itself cannot be made on demand)."""
    from horovod.runner.common.util import safe_shell_exec

    from hvd_ctsm.distributed import launchers

    monkeypatch.setattr(safe_shell_exec, "_exec_middleman", safe_shell_exec._exec_middleman)
    launchers.quiet_middlemen()
    assert safe_shell_exec._exec_middleman is launchers.middleman_without_gone_workers
    assert safe_shell_exec.execute("echo from the worker; exit 3") == 3
    assert "from the worker" in capfd.readouterr().out
