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
