"""The doctor's checks of distributed training: the temporary folder its launchers need and the
OpenMP threads its workers are given, Horovod's build, the 2-rank allreduce self-tests under
horovodrun and torchrun, and the GPU; and Check, the result every doctor check returns (here, so
that this module needs nothing from hvd_ctsm.doctor, which imports it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    cause: str = ""
    fix: str = ""
    seconds: float = 0.0
    skipped: bool = False


# Python's tempfile and Open MPI both take the first of these that is set, else /tmp.
TEMP_VARIABLES = ("TMPDIR", "TEMP", "TMP")


def temp_folder() -> tuple[str, str]:
    """The variable that names the temporary folder ("" where none is set) and the folder."""
    for variable in TEMP_VARIABLES:
        if os.environ.get(variable):
            return variable, os.environ[variable]
    return "", "/tmp"


def temp_folder_problem() -> str:
    """What is wrong with the temporary folder ("does not exist", ...), "" when nothing is. It is
    read from the environment, as Open MPI does: Python's tempfile skips a bad one unannounced."""
    folder = temp_folder()[1]
    if not os.path.isdir(folder):
        return "is not a folder" if os.path.exists(folder) else "does not exist"
    try:
        with tempfile.TemporaryFile(dir=folder):
            return ""
    except OSError as exc:
        return f"cannot be written to ({exc.strerror})"


def check_temp_folder() -> Check:
    variable, folder = temp_folder()
    named = f"{variable}={folder}" if variable else f"{folder} (TMPDIR unset)"
    problem = temp_folder_problem()
    if not problem:
        return Check("temporary folder", True, f"{named} is writable")
    missing = problem == "does not exist"
    mpi = "creates it" if missing else "stops with 'orte_session_dir failed'"
    fix = f"point {variable} at a folder you can write to, or unset it (/tmp)" if variable \
        else "set TMPDIR to a folder you can write to"
    return Check("temporary folder", False, f"{named} {problem}",
                 cause=f"Open MPI (horovodrun --mpi) {mpi}; mktemp (setup's Horovod build) "
                 "fails; Python quietly writes to /tmp instead",
                 fix=f"mkdir -p {folder}, or {fix}" if missing else fix)


def omp_threads_valid(value: str) -> bool:
    """OpenMP's syntax: positive whole numbers, one per nesting level ("4" or "4,2")."""
    return all(re.fullmatch(r"\s*\+?\d+\s*", part, re.ASCII) and int(part) > 0
               for part in value.split(","))


def check_omp_threads() -> Check:
    value = os.environ.get("OMP_NUM_THREADS")
    if value is None or omp_threads_valid(value):
        return Check("OMP_NUM_THREADS", True, "unset" if value is None else value)
    return Check("OMP_NUM_THREADS", False, f"OMP_NUM_THREADS={value!r}: not a positive whole "
                 "number", cause="OpenMP (torch's libgomp) prints 'libgomp: Invalid value for "
                 "environment variable OMP_NUM_THREADS' in every process and ignores it: torch "
                 "then takes its default, a thread per core, in each",
                 fix="unset OMP_NUM_THREADS, or set it to a positive whole number such as 1")


def check_torch_allreduce() -> Check:
    """The torch backend's self-test under torchrun (2 ranks, Gloo)."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "hvd_ctsm.distributed",
           "selftest"]
    name = "allreduce (torch gloo, 2 ranks)"
    # torchrun keeps its workers' logs in a torchelastic_* folder it makes in the temporary
    # folder and never removes: here that is a folder of ours, removed after.
    with tempfile.TemporaryDirectory(prefix="hvd_ctsm-doctor-", ignore_cleanup_errors=True) as tmp:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp})
        except subprocess.TimeoutExpired:
            return Check(name, False, "timed out after 180 s", cause="the ranks did not meet",
                         fix="check that localhost resolves and nothing blocks local ports")
    from hvd_ctsm.distributed import parse_selftest

    reports = parse_selftest(proc.stdout)
    if proc.returncode == 0 and len(reports) == 2 and all(r["ok"] for r in reports):
        return Check(name, True, f"exact sum on both ranks {reports[0]['sum']}")
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return Check(name, False, f"exit {proc.returncode}", cause=" | ".join(tail),
                 fix="see the cause; torch must be the pinned CPU or CUDA build")


def check_horovod_build() -> Check:
    """Horovod's extension for PyTorch loads and has MPI and Gloo. In a child process, so that
    an extension that crashes on import fails this check, not the doctor."""
    try:
        proc = subprocess.run([sys.executable, "-m", "hvd_ctsm.distributed", "build"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("horovod build", False, "the build check did not run", cause=str(exc),
                     fix="./run.sh setup (builds Horovod 0.28.1 with the C++17 fix)")
    found = re.search(r"^BUILD (.*)$", proc.stdout, re.M)
    built = json.loads(found.group(1)) if found else {}
    missing = [name for key, name in (("pytorch", "PyTorch"), ("mpi", "MPI"), ("gloo", "Gloo"))
               if not built.get(key)]
    if missing:
        error = (proc.stderr.strip().splitlines() or [""])[-1] if not found else ""
        return Check("horovod build", False, f"missing: {', '.join(missing)}",
                     cause=error or "Horovod was built without them (or the PyTorch extension "
                     "failed: 'C++17 or later compatible compiler is required')",
                     fix="./run.sh setup rebuilds it with HOROVOD_WITH_PYTORCH/GLOO/MPI=1, "
                     "CMAKE_CXX_STANDARD 17 and the system cmake 3.25 (cmake 4 rejects Gloo)")
    return Check("horovod build", True, f"Horovod {built['version']}: PyTorch + MPI + Gloo")


def check_allreduce(transport: str = "gloo") -> Check:
    if transport == "mpi" and temp_folder_problem():
        # Its failure would only repeat the temporary folder's check, in Open MPI's words; and a
        # missing folder it would create, leaving it behind.
        return Check(f"allreduce ({transport}, 2 ranks)", True, "not run: Open MPI needs the "
                     "temporary folder, whose check failed", skipped=True)
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
    cmd = [horovodrun, "-np", "2", f"--{transport}", sys.executable, "-m",
           "hvd_ctsm.distributed", "selftest"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        return Check(f"allreduce ({transport}, 2 ranks)", False, "timed out after 180 s",
                     cause="the ranks did not meet", fix="run `./run.sh doctor` again; check "
                     "that nothing else holds the ports and that localhost resolves")
    from hvd_ctsm.distributed import parse_selftest

    reports = parse_selftest(proc.stdout)
    ok = proc.returncode == 0 and len(reports) == 2 and all(r["ok"] for r in reports)
    if ok:
        return Check(f"allreduce ({transport}, 2 ranks)", True,
                     f"exact sum on both ranks {reports[0]['sum']}")
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return Check(f"allreduce ({transport}, 2 ranks)", False, f"exit {proc.returncode}",
                 cause=" | ".join(tail), fix="see the cause; `horovodrun --check-build` must "
                 f"list {transport}; for MPI as root horovodrun adds --allow-run-as-root")


def check_gpu() -> Check:
    import torch

    if not torch.cuda.is_available():
        return Check("cuda + nccl", True, "no GPU here: skipped", skipped=True)
    from hvd_ctsm.distributed import build_info

    nccl = build_info()["nccl"]
    return Check("cuda + nccl", nccl, f"{torch.cuda.get_device_name(0)}, NCCL built: {nccl}",
                 fix="" if nccl else "rebuild with HOROVOD_GPU_OPERATIONS=NCCL ./run.sh setup")
