"""A job that writes an output folder as the feature job, the Spark scorer and the estimator's
predictions do (hvd_ctsm.files.outputs.staged), started when told: imports first, says so by a
file `ready-PID` beside the file argv[1], waits for argv[1] to appear, then writes OUT=argv[2]
(argv[3] "overwrite" or not) holding a file `job` with its name, argv[4], argv[5] times one after
the other (a scheduled job run again and again). Its one line and exit code are a program's
(hvd_ctsm.errors.run_cli)."""

import os
import sys
import time
from pathlib import Path

from hvd_ctsm.errors import run_cli
from hvd_ctsm.files import outputs


def main(argv: list[str]) -> int:
    go, out, overwrite, name = Path(argv[0]), Path(argv[1]), argv[2] == "overwrite", argv[3]
    times = int(argv[4])
    (go.parent / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    for _ in range(times):
        with outputs.staged(out, overwrite, "features") as stage:
            (stage / "job").write_text(name)
            time.sleep(0.2 / times)  # the job's work, long enough for two to overlap
        print(f"wrote {out}")
    return 0


sys.exit(run_cli(main, "staged-writer", sys.argv[1:]))
