"""Deploys that overlap or are killed, as scheduled jobs' do: real `hvd-ctsm deploy` processes
into one registry. The unit-tier deploy tests are in tests/unit/test_deploy_complete.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hvd_ctsm.errors import run_cli
from hvd_ctsm.serving import deploy
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # the checkout's hvd_ctsm, from any folder
MODEL_BYTES = 8 << 20  # copying and checking it takes long enough for deploys to overlap


def gated_run(root: Path, name: str, size: int = MODEL_BYTES) -> Path:
    """A run folder whose model (distinct bytes per name) passed its gate, with its dataset's
    metadata and vocabulary beside it."""
    features = root / "features"
    features.mkdir(parents=True, exist_ok=True)
    (features / "metadata.json").write_text("{}")
    (features / "vocab.json").write_text('{"items": []}')
    run = root / name
    run.mkdir()
    weights = name.encode() * (size // len(name))
    digest = hashlib.sha256(weights).hexdigest()
    (run / "model.pt").write_bytes(weights)
    (run / "model.pt.sha256").write_text(digest)
    (run / "config.yaml").write_text("epochs: 1\n")
    (run / "backtest.json").write_text(json.dumps(
        {"data": str(features), "split": "test", "model": {}, "model_sha256": digest,
         "gate": {"passed": True, "checks": []}}))
    return run


def deploy_command(run: Path, registry: Path) -> list[str]:
    return ["--model", str(run), "--report", str(run / "backtest.json"), "--registry",
            str(registry)]


def deploy_together(runs: list[Path], registry: Path, go: Path) -> list[tuple[int, str, str]]:
    """One deploy process per run, each released at once when every one has started: each
    one's (exit code, stdout, stderr)."""
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests/helpers/deploy_at_once.py"),
                               str(go), *deploy_command(run, registry)], cwd=REPO,
                              env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for run in runs]
    deadline = time.monotonic() + 120
    while len(list(go.parent.glob("ready-*"))) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.01)  # their imports
    go.touch()
    ended = [(proc, *proc.communicate(timeout=120)) for proc in procs]
    for ready in [go, *go.parent.glob("ready-*")]:
        ready.unlink()
    return [(proc.returncode, out, err) for proc, out, err in ended]


def versions(registry: Path) -> list[str]:
    return sorted(p.name for p in registry.glob("v[0-9]*"))


@pytest.mark.slow
@pytest.mark.faults
def test_deploys_at_the_same_moment_each_publish_and_current_names_the_newest(tmp_path):
    """Before: two deploys took the same next vNNNN (the second crashed on the rename, exit 3)
    or wrote `current` in the order they finished, so that it named an older version."""
    registry = tmp_path / "registry"
    for round_ in range(6):
        runs = [gated_run(tmp_path, f"run-{round_}-{i}") for i in range(4)]
        before = versions(registry) if registry.exists() else []
        for code, out, err in deploy_together(runs, registry, tmp_path / "go"):
            assert code == 0 and out.startswith("deployed "), f"round {round_}: {err}"
        new = sorted(set(versions(registry)) - set(before))
        assert len(new) == len(runs), f"round {round_}: {new}"
        assert deploy.current(registry).name == versions(registry)[-1], f"round {round_}"
        digests = {(registry / v / "model.pt.sha256").read_text() for v in new}
        assert digests == {(run / "model.pt.sha256").read_text() for run in runs}
        assert not list(registry.glob(".staging-*"))


@pytest.mark.slow
@pytest.mark.faults
def test_a_deploy_killed_mid_copy_leaves_a_stage_the_next_deploy_removes(tmp_path):
    """Before: every deploy killed while it copied left its partial copy (.staging-*) in the
    registry for good; nothing read it, but each held up to a model's size."""
    run = gated_run(tmp_path, "run", size=128 << 20)  # a copy long enough to be killed in
    left = []
    for attempt in range(5):  # the kill may land after the copy: try again, in a new registry
        registry = tmp_path / f"registry-{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "hvd_ctsm", "deploy",
                                 *deploy_command(run, registry)], cwd=REPO,
                                env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not list(registry.glob(".staging-*")):
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        left = list(registry.glob(".staging-*"))
        if left:
            break
    assert left, "no deploy was killed while it copied"
    done = subprocess.run([sys.executable, "-m", "hvd_ctsm", "deploy",
                           *deploy_command(run, registry)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr
    assert not list(registry.glob(".staging-*"))
    deployed = deploy.current(registry) / "model.pt"
    assert deployed.read_bytes() == (run / "model.pt").read_bytes()


@pytest.fixture
def shared_folder():
    """A folder every user may enter (pytest's own are the owner's only), removed after."""
    with tempfile.TemporaryDirectory(prefix="hvd-ctsm-team-") as folder:
        os.chmod(folder, 0o777)
        yield Path(folder)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="deploys as another user: needs root to switch")
def test_a_shared_registry_takes_a_second_users_deploy(shared_folder):
    """A team's registry (a folder the team may write): the deploy lock file the first deployer
    made (mode 0644 by its umask) was opened to write, so another user's deploy stopped on
    'permission denied' (exit 2); and deploying again what `current` holds, into a registry the
    user may only read, no longer said 'already deployed' (exit 0)."""
    first = gated_run(shared_folder, "first", 4096)
    second = gated_run(shared_folder, "second", 4096)
    registry = shared_folder / "registry"
    old_umask = os.umask(0o022)  # as most users have it
    try:
        assert deploy.main(deploy_command(first, registry)) == 0
    finally:
        os.umask(old_umask)
    assert (registry / deploy.LOCK).stat().st_mode & 0o777 == 0o644
    said = shared_folder / "said"

    def as_another_user(run: Path) -> tuple[int, str]:
        """The deploy command in a forked child that is user nobody: this interpreter's own
        files need not be theirs to read (a venv in root's home is not)."""
        said.write_text("")
        os.chmod(said, 0o666)
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                with open(said, "w") as out, contextlib.redirect_stdout(out), \
                        contextlib.redirect_stderr(out):
                    code = run_cli(deploy.main, "hvd-ctsm deploy", deploy_command(run, registry))
            finally:
                os._exit(code)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), said.read_text()

    code, out = as_another_user(first)  # the registry as the first deployer left it
    assert code == 0 and out.startswith("already deployed"), out
    os.chmod(registry, 0o777)  # the team's to write
    code, out = as_another_user(second)
    assert code == 0 and out.startswith("deployed"), out
    assert (registry / "current").read_text() == "v0002\n"


@pytest.mark.slow
@pytest.mark.faults
def test_a_deploy_killed_before_it_moved_current_is_finished_by_the_next(tmp_path):
    """A deploy killed between publishing its version and moving `current` to it: the next
    deploy of the same model points `current` at that version. Before: it made one more copy
    (v0002) and the unnamed v0001 stayed in the registry for good."""
    run = gated_run(tmp_path, "run", size=64 << 20)  # checking the copy takes long enough
    for attempt in range(8):  # the kill may land before the rename or after `current`
        registry = tmp_path / f"registry-{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "hvd_ctsm", "deploy",
                                 *deploy_command(run, registry)], cwd=REPO, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not (registry / "v0001").exists():
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if (registry / "v0001").exists() and deploy.current(registry) is None:
            break
    else:
        pytest.skip("no deploy was killed between its rename and `current`")
    done = subprocess.run([sys.executable, "-m", "hvd_ctsm", "deploy",
                           *deploy_command(run, registry)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr
    assert versions(registry) == ["v0001"]
    assert deploy.current(registry) == registry / "v0001"
