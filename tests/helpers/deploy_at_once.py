"""A deploy that starts when told: imports first, says so by a file `ready-PID` beside the file
argv[1], waits for argv[1] to appear, then runs `hvd-ctsm deploy` with the rest of argv as a
user's command would (hvd_ctsm.errors.run_cli: its one line and exit code). Several started
together overlap in deploy itself, not in Python's start-up, whose times differ by more than a
deploy takes."""

import os
import sys
import time
from pathlib import Path

from hvd_ctsm.errors import run_cli
from hvd_ctsm.serving import deploy

go = Path(sys.argv[1])
(go.parent / f"ready-{os.getpid()}").touch()
deadline = time.monotonic() + 120
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
sys.exit(run_cli(deploy.main, "hvd-ctsm deploy", sys.argv[2:]))
