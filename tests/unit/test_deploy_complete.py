"""deploy publishes only complete versions, resolves the report's data path from the report, and
checks what it wrote; a missing model is one line with exit code 2 (hvd_ctsm.errors)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.serving import deploy
from tests.conftest import REPO


def run_folder(tmp_path: Path, data: str) -> tuple[Path, Path]:
    """A run folder (model.pt, its .sha256, config.yaml) and a report whose gate passed."""
    run = tmp_path / "work" / "run"
    run.mkdir(parents=True)
    model = run / "model.pt"
    model.write_bytes(b"weights")
    Path(f"{model}.sha256").write_text(hashlib.sha256(b"weights").hexdigest())
    (run / "config.yaml").write_text("epochs: 1\n")
    report = run / "backtest.json"
    report.write_text(json.dumps({"data": data, "model": {},
                                  "gate": {"passed": True, "checks": []},
                                  "model_sha256": hashlib.sha256(b"weights").hexdigest()}))
    return run, report


def features_beside(tmp_path: Path) -> None:
    """The dataset a run_folder(tmp_path, "../features") report names: metadata and vocab."""
    features = tmp_path / "work" / "features"
    features.mkdir()
    (features / "metadata.json").write_text("{}")
    (features / "vocab.json").write_text('{"items": []}')


def test_a_version_without_metadata_and_vocab_is_refused(tmp_path):
    run, report = run_folder(tmp_path, "no-such-features")
    registry = tmp_path / "registry"
    code = deploy.main(["--model", str(run), "--report", str(report), "--registry",
                        str(registry)])
    assert code == 1
    assert deploy.current(registry) is None and not list(registry.glob("v*"))


def test_a_relative_data_path_is_found_beside_the_report_and_the_copy_checked(tmp_path):
    run, report = run_folder(tmp_path, "../features")  # relative to the report's folder
    features_beside(tmp_path)
    version = deploy.deploy(run, report, tmp_path / "registry")
    assert deploy.current(tmp_path / "registry") == version
    assert (version / "vocab.json").read_text() == '{"items": []}'
    assert set(deploy.REQUIRED) == {p.name for p in version.iterdir()}


def test_a_missing_model_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm.serving.deploy", "--model",
                           str(tmp_path / "nothing"), "--report", str(tmp_path / "r.json"),
                           "--registry", str(tmp_path / "registry")], capture_output=True,
                          text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not found" in proc.stderr


def test_what_deploy_and_atomic_writes_make_is_as_readable_as_the_umask_allows(tmp_path):
    """mkstemp's 0o600 and mkdtemp's 0o700 made model.pt, metadata.json and each deployed
    version unreadable to every other user (a serving job, an executor running as another
    user). Under a umask of 027, in a fresh process: files 0o640, folders 0o750."""
    run, report = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    script = ("import os, sys\nos.umask(0o027)\nfrom pathlib import Path\n"
              "from hvd_ctsm.files.atomic import atomic_write_bytes\n"
              "from hvd_ctsm.serving import deploy\n"
              "atomic_write_bytes(Path(sys.argv[1]) / 'written.json', b'{}')\n"
              "print(deploy.deploy(sys.argv[2], sys.argv[3], sys.argv[4]))")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(run), str(report),
                           str(tmp_path / "registry")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version = Path(proc.stdout.strip().splitlines()[-1])
    mode = lambda path: path.stat().st_mode & 0o777  # noqa: E731
    assert mode(tmp_path / "written.json") == 0o640
    assert mode(version) == 0o750
    assert {mode(p) for p in version.iterdir()} == {0o640}
    assert mode(tmp_path / "registry" / "current") == 0o640


def test_deploying_what_current_holds_again_makes_no_new_version(tmp_path, capsys):
    """A pipeline rerun, or a second `deploy` of the same run: before, each made a new version
    of the same bytes. A new report or model still makes one."""
    run, report = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    registry = tmp_path / "registry"
    args = ["--model", str(run), "--report", str(report), "--registry", str(registry)]
    assert deploy.main(args) == 0
    assert deploy.main(args) == 0
    assert sorted(p.name for p in registry.glob("v*")) == ["v0001"]
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"already deployed: {registry / 'v0001'} holds this model"), out
    report.write_text(report.read_text().replace('"checks": []', '"checks": [], "again": 1'))
    assert deploy.main(args) == 0
    assert sorted(p.name for p in registry.glob("v*")) == ["v0001", "v0002"]
    assert deploy.current(registry) == registry / "v0002"
    assert capsys.readouterr().out.startswith(f"deployed {registry / 'v0002'}")


def deploy_line(args: list[str], capsys) -> tuple[int, str]:
    """deploy's exit code and its one stderr line, as the command gives them (run_cli)."""
    from hvd_ctsm.errors import run_cli

    code = run_cli(deploy.main, "hvd-ctsm deploy", args)
    err = capsys.readouterr().err
    assert err.count("\n") == (code != 0), err
    return code, err


def test_a_damaged_model_or_one_without_its_checksum_is_bad_input(tmp_path, capsys):
    """A truncated or bit-flipped model.pt was refused with exit 1 as "made for another model
    file", and one without its .sha256 with a fix about the report's `data` field."""
    run, report = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    registry = tmp_path / "registry"
    args = ["--model", str(run), "--report", str(report), "--registry", str(registry)]
    model, checksum = run / "model.pt", run / "model.pt.sha256"
    for damaged in (b"weigh", b"weightS"):  # truncated; one byte changed
        model.write_bytes(damaged)
        code, err = deploy_line(args, capsys)
        assert code == 2 and f"{model}: checksum mismatch (truncated or corrupted)" in err, err
    model.write_bytes(b"weights")
    checksum.unlink()
    code, err = deploy_line(args, capsys)
    assert code == 2 and f"{checksum} not found" in err and "`data`" not in err, err
    assert not registry.exists()


def test_what_is_not_a_backtest_report_is_named_as_such(tmp_path, capsys):
    """An empty file was json's "Expecting value: line 1 column 1 (char 0)", a folder "[Errno 21]
    Is a directory", and a dataset's metadata.json exit 1 "no gate was applied"."""
    from hvd_ctsm.evaluation import gate

    run, _ = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    empty = tmp_path / "empty.json"
    empty.write_text("")
    metadata = tmp_path / "work" / "features" / "metadata.json"
    for report, why in ((empty, "not JSON: empty or damaged"), (run, "it is a folder"),
                        (metadata, "JSON without a report's model field")):
        args = ["--model", str(run), "--report", str(report)]
        code, err = deploy_line([*args, "--registry", str(tmp_path / "registry")], capsys)
        assert code == 2 and f"{report} is not a backtest report ({why})" in err, err
        assert gate.main(["--report", str(report), "--gate", "mrr>0"]) == 2
        assert f"{report} is not a backtest report ({why})" in capsys.readouterr().err
    assert not (tmp_path / "registry").exists() and empty.read_text() == ""


def test_the_registry_option_names_a_registry_folder(tmp_path, capsys):
    """--registry a file was "[Errno 17] File exists", and the dataset "pick an --out"."""
    from hvd_ctsm.files import outputs

    run, report = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    features = tmp_path / "work" / "features"
    scores = tmp_path / "scores"
    scores.mkdir()
    outputs.mark(scores, "scores")
    args = ["--model", str(run), "--report", str(report), "--registry"]
    for registry, said in ((report, f"--registry {report} is a file, not a registry folder"),
                           (features, "pick another --registry, outside every input"),
                           (scores, f"refusing to deploy into {scores}: it holds hvd_ctsm scores"
                                    " output")):
        code, err = deploy_line([*args, str(registry)], capsys)
        assert code == 2 and said in err, err
    registry = tmp_path / "registry"
    assert deploy_line([*args, str(registry)], capsys)[0] == 0
    code, err = deploy_line([*args, str(registry / "v0001")], capsys)
    assert code == 2 and f"lies inside the model registry {registry}" in err, err
    other = tmp_path / "other-features"
    other.mkdir()
    outputs.mark(other, "features")  # a dataset that is no input of this deploy
    code, err = deploy_line([*args, str(other / "registry")], capsys)
    assert code == 2 and f"lies inside the feature dataset {other}" in err, err
    assert sorted(p.name for p in other.iterdir()) == [outputs.MARKER]
    assert sorted(p.name for p in (registry / "v0001").iterdir()) == sorted(deploy.REQUIRED)
    assert [p.name for p in scores.iterdir()] == [outputs.MARKER]
    # A folder of the user's own files was marked a registry and got v0001 beside them
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's notes")
    code, err = deploy_line([*args, str(mine)], capsys)
    assert code == 2 and "it holds files deploy did not write" in err, err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_registry_where_no_lock_can_be_taken_takes_the_deploy_with_a_warning(
        tmp_path, monkeypatch, capsys):
    """An NFS mount without its lock manager refuses every flock (ENOLCK): the deploy crashed
    there, exit 3, and published nothing. A stand-in for that mount, which cannot be made here:
    flock raising as it does there. Other errors of flock stay errors."""
    run, report = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    registry = tmp_path / "registry"

    def flock_refused(fd, operation, code=errno.ENOLCK):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(deploy.fcntl, "flock", flock_refused)
    args = ["--model", str(run), "--report", str(report), "--registry", str(registry)]
    assert deploy.main(args) == 0
    assert deploy.current(registry) == registry / "v0001"
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {registry} is on a file system without locks (No locks available): this "
        "deploy is not kept from another one into the registry at the same moment; deploy "
        "there one at a time"]
    monkeypatch.setattr(deploy.fcntl, "flock",
                        lambda fd, operation: flock_refused(fd, operation, errno.EBADF))
    with pytest.raises(OSError) as raised:
        deploy.deploy(run, report, tmp_path / "other")
    assert raised.value.errno == errno.EBADF


def test_the_registry_lock_is_taken_where_only_files_open_for_writing_are_locked(
        tmp_path, monkeypatch, capsys):
    """An NFS client takes an exclusive flock only on a file open for writing (flock(2)): the
    lock file, opened to read, gave EBADF, and every deploy into a registry on NFS crashed, exit
    3. A stand-in for that mount (none can be made here): flock refusing a read-only file. It
    is opened for writing now; a lock file another user made, which this one may only read
    (the open's PermissionError stands in for that user), says what to change."""
    real_flock = fcntl.flock

    def nfs_flock(fd, operation):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real_flock(fd, operation)

    run, report = run_folder(tmp_path, "../features")
    features_beside(tmp_path)
    monkeypatch.setattr(deploy.fcntl, "flock", nfs_flock)
    registry = tmp_path / "registry"
    assert deploy.deploy(run, report, registry) == registry / "v0001"
    assert capsys.readouterr().err == ""  # locked, as on a local disk

    real_open = os.open

    def another_users_file(path, flags, *mode):
        if os.fspath(path).endswith(deploy.LOCK) and flags & os.O_ACCMODE != os.O_RDONLY:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(deploy.os, "open", another_users_file)
    other = tmp_path / "other"
    assert deploy.deploy(run, report, other) == other / "v0001"
    assert capsys.readouterr().err.splitlines() == [
        f"warning: this file system locks only files open for writing, and {other / deploy.LOCK}"
        " is not this user's to write: this deploy is not kept from another one into the "
        "registry at the same moment; make that file writable for every deployer"]
