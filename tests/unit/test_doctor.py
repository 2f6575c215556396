"""The doctor: every check passes on this machine; a broken pin fails with its fix.
This file holds the unit-tier part; the rest is in tests/integration/test_doctor.py."""

from hvd_ctsm import doctor


def test_a_torch_only_setup_skips_the_horovod_checks_and_lists_the_backends(monkeypatch, capsys):
    monkeypatch.setenv("HVD_CTSM_BACKENDS", "torch")
    assert doctor.main(["--skip-slow"]) == 0
    out = capsys.readouterr().out
    assert "OK   backends" in out and "usable: torch" in out
    assert "horovod build" not in out


def test_pins_are_read_from_the_constraints_file(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("# comment\ntorch==2.13.0  # why\nPyYAML==6.0.3\n\nnot-a-pin>=1\n")
    assert doctor.read_pins(path) == {"torch": "2.13.0", "pyyaml": "6.0.3"}


def test_each_stack_accepts_the_pythons_it_was_verified_on(monkeypatch):
    monkeypatch.setenv("HVD_CTSM_STACK", "classic")
    check = doctor.check_python((3, 12, 1))
    assert not check.ok and "classic stack is verified on Python 3.11 only" in check.cause
    assert check.fix == "create its venv with one of them: PYTHON=python3.11 ./run.sh setup"
    monkeypatch.setenv("HVD_CTSM_STACK", "current")
    assert doctor.check_python((3, 12, 1)).ok
    check = doctor.check_python((3, 10, 14))
    assert not check.ok and "3.11, 3.12, 3.13 only" in check.cause
    assert "HVD_CTSM_STACK=current PYTHON=python3.13 ./run.sh setup" in check.fix


def test_a_long_check_name_keeps_a_space_before_its_detail():
    line = doctor.format_line(doctor.Check("allreduce (torch gloo, 2 ranks)", True, "exact sum"))
    assert line.startswith("OK   allreduce (torch gloo, 2 ranks) exact sum")


def test_a_java_home_without_java_is_named_with_its_fix(monkeypatch, tmp_path):
    """JAVA_HOME=/nowhere failed as 'spark raised JAVA_GATEWAY_EXITED' with the fix to
    reinstall the stack; a good JAVA_HOME without java on PATH failed as 'java not found'."""
    from hvd_ctsm.doctor import check_spark

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    check = check_spark()
    assert not check.ok and check.detail == f"JAVA_HOME={tmp_path / 'nowhere'} has no bin/java"
    assert "point JAVA_HOME at a Java 17" in check.fix


def test_a_spark_that_cannot_start_its_jvm_names_java_home(monkeypatch, tmp_path):
    """hvd-ctsm features with JAVA_HOME=/nowhere said 'crashed ... JAVA_GATEWAY_EXITED'."""
    from hvd_ctsm.spark_session import no_java_line

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    assert f"JAVA_HOME={tmp_path / 'nowhere'} has no bin/java" in no_java_line()


def test_a_missing_temporary_folder_fails_first_and_the_mpi_check_is_not_run(monkeypatch,
                                                                              tmp_path, capsys):
    """TMPDIR=/nonexistent showed only as the MPI allreduce's failure, or passed, Open MPI
    creating the folder (left behind); Python's tempfile quietly falls back to /tmp."""
    missing = tmp_path / "missing"
    monkeypatch.setenv("TMPDIR", str(missing))
    monkeypatch.setenv("HVD_CTSM_BACKENDS", "torch")
    assert doctor.main(["--skip-slow"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith(f"FAIL temporary folder                TMPDIR={missing} "
                                          "does not exist")  # second, after the Python
    assert f"fix:   mkdir -p {missing}, or point TMPDIR at a folder you can write to" in out
    check = doctor.check_allreduce("mpi")
    assert check.skipped and "Open MPI needs the temporary folder" in check.detail
    assert not missing.exists()


def test_a_temporary_folder_that_is_a_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")
    check = doctor.check_temp_folder()
    assert not check.ok and check.detail == f"TMPDIR={tmp_path / 'file'} is not a folder"
    assert "orte_session_dir failed" in check.cause
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert doctor.check_temp_folder().ok


def test_an_omp_num_threads_openmp_rejects_fails_with_its_value(monkeypatch, capsys):
    """OMP_NUM_THREADS=0 passed; libgomp says 'Invalid value' in every process and ignores it."""
    monkeypatch.setenv("HVD_CTSM_BACKENDS", "torch")
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    assert doctor.main(["--skip-slow"]) == 1
    out = capsys.readouterr().out
    assert "FAIL OMP_NUM_THREADS                 OMP_NUM_THREADS='0': not a positive whole " \
        "number" in out
    assert "fix:   unset OMP_NUM_THREADS, or set it to a positive whole number" in out
    for bad in ("abc", "-1", "", "2.5", "2,0"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert not doctor.check_omp_threads().ok, bad
    for good in ("1", "4,2", " 2 "):  # OpenMP's list: threads per nesting level
        monkeypatch.setenv("OMP_NUM_THREADS", good)
        assert doctor.check_omp_threads().ok, good
