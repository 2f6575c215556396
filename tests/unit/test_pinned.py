"""A failed read of a pinned dataset is said as the swap when the folder holds another build, and
stands as it is otherwise (hvd_ctsm.data.pinned.failure_said_as_replaced). The real swap under
a reading step is tested in tests/integration/test_dataset_replaced.py."""

import json

import pytest

from hvd_ctsm.data.pinned import DatasetReplacedError, Pin, failure_said_as_replaced


def pinned_folder(tmp_path):
    meta = {"build": 1}
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    return Pin(tmp_path, meta)


def test_a_failed_read_of_a_rebuilt_folder_is_said_as_replaced(tmp_path):
    pin = pinned_folder(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"build": 2}))
    with pytest.raises(DatasetReplacedError, match="replaced while this step read it"):
        with failure_said_as_replaced(pin.check, FileNotFoundError):
            raise FileNotFoundError("part-00001.parquet")


def test_a_failed_read_of_the_same_build_keeps_its_own_error(tmp_path):
    pin = pinned_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="part-00001"):
        with failure_said_as_replaced(pin.check, FileNotFoundError):
            raise FileNotFoundError("part-00001.parquet")


def test_only_the_named_errors_and_only_failures_are_checked(tmp_path):
    pin = pinned_folder(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"build": 2}))
    with pytest.raises(ValueError):  # not a read failure of the swap's kind: not checked
        with failure_said_as_replaced(pin.check, FileNotFoundError):
            raise ValueError("bad value")
    with failure_said_as_replaced(pin.check, FileNotFoundError):
        pass  # a read that worked is checked by its caller where it must be, not here
    with pytest.raises(FileNotFoundError):  # a remote dataset is never pinned
        with failure_said_as_replaced(None, FileNotFoundError):
            raise FileNotFoundError("s3 object")
