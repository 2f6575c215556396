"""hvd_ctsm.spark_session without Spark: where Ctrl-C finds the driver's main thread."""

import os
import sys

from hvd_ctsm.spark_session import waiting_on_the_jvm


def frame_inside(filename: str):
    """The frame of a function compiled as if it were in `filename`, called from here."""
    namespace = {}
    exec(compile("def call(f):\n    return f()\n", filename, "exec"), namespace)
    return namespace["call"](lambda: sys._getframe())


def test_a_frame_under_a_py4j_call_is_waiting_on_the_jvm_and_others_are_not():
    py4j = os.path.join(os.sep, "venv", "site-packages", "py4j", "clientserver.py")
    assert waiting_on_the_jvm(frame_inside(py4j))
    assert not waiting_on_the_jvm(frame_inside(os.path.join(os.sep, "work", "py4jish.py")))
    assert not waiting_on_the_jvm(sys._getframe()) and not waiting_on_the_jvm(None)
