"""Checks the stack this project needs, one line each, and says how to fix what is wrong.

    python -m hvd_ctsm.doctor [--json] [--skip-slow]

Exit code 1 when any check fails. The stack is HVD_CTSM_STACK (classic or current, as setup
takes it), else the one installed: classic where Horovod is, current where it is not. Its pins are
read from its constraints file beside the package (constraints.txt, constraints-current.txt);
HVD_CTSM_CONSTRAINTS points at another; an installed wheel has none, and then the versions are
checked against the package's own declared requirements. HVD_CTSM_BACKENDS=torch (the setup knob
that leaves Horovod out, and the current stack's default) skips the Horovod checks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from hvd_ctsm.doctor_distributed import (Check, check_allreduce, check_gpu, check_horovod_build,
                                         check_omp_threads, check_temp_folder,
                                         check_torch_allreduce)
from hvd_ctsm.errors import arg_parser

REPO = Path(__file__).resolve().parents[1]

CONSTRAINTS = {"classic": "constraints.txt", "current": "constraints-current.txt"}
# The Pythons each stack's part of CI has passed on (3.12 and 3.13 run by hand:
# docs/SUPPORTED_STACK.md). The classic stack stops at 3.11: its pyarrow 10 has no wheels past it.
VERIFIED_PYTHONS = {"classic": ((3, 11),), "current": ((3, 11), (3, 12), (3, 13))}
# Known causes, keyed by package, for a version that is off from the classic stack's pins.
VERSION_FIXES = {
    "pyarrow": "pyarrow >= 11 breaks horovod.spark's TorchEstimator ('Schema' object has no "
    "attribute 'to_arrow_schema', horovod#3829) and pyarrow >= 15 Petastorm's reader: "
    "pip install pyarrow==10.0.1 (./run.sh setup does)",
    "torch": "a newer torch needs Horovod rebuilt against it and often pulls CUDA packages: "
    "pip install torch==<pin> then ./run.sh setup",
    "horovod": "Horovod must be built from its sdist with the C++17 fix: ./run.sh setup",
    "numpy": "pyarrow 10 is built against numpy 1.x: pip install 'numpy<2' (the pin)",
    "pyspark": "Spark 4 needs a pyarrow that Petastorm and horovod.spark do not accept: "
    "pip install pyspark==<pin>",
}


def stack() -> str:
    """HVD_CTSM_STACK, else what is installed: the current stack has no Horovod."""
    from hvd_ctsm.distributed import horovod_importable

    chosen = os.environ.get("HVD_CTSM_STACK") or ("classic" if horovod_importable() else "current")
    if chosen not in CONSTRAINTS:
        raise ValueError(f"HVD_CTSM_STACK={chosen}: expected classic or current")
    return chosen


def constraints_path() -> Path:
    return Path(os.environ.get("HVD_CTSM_CONSTRAINTS", REPO / CONSTRAINTS[stack()]))


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s#;]+)", line.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_python(version_info: tuple = sys.version_info) -> Check:
    version = ".".join(map(str, version_info[:3]))
    verified = VERIFIED_PYTHONS[stack()]
    if tuple(version_info[:2]) in verified:
        return Check("python", True, version)
    names = [f"{major}.{minor}" for major, minor in verified]
    chosen = "HVD_CTSM_STACK=current " if stack() == "current" else ""
    return Check("python", False, version,
                 cause=f"the {stack()} stack is verified on Python {', '.join(names)} only",
                 fix=f"create its venv with one of them: {chosen}PYTHON=python{names[-1]} "
                 "./run.sh setup")


def check_pins() -> Check:
    path = constraints_path()
    if not path.is_file() and "HVD_CTSM_CONSTRAINTS" not in os.environ:
        return check_requirements()  # an installed wheel: the pins stay with the checkout
    pins = read_pins(path)
    if "horovod" not in wanted_backends():  # left out on purpose by the setup knob
        pins.pop("horovod", None)
    wrong = []
    for name, want in sorted(pins.items()):
        have = installed_version(name)
        # A local build tag (torch's "+cpu") is the same release.
        if have is None or have.split("+")[0] != want.split("+")[0]:
            wrong.append((name, want, have))
    if not wrong:
        return Check("package pins", True, f"{len(pins)} packages match {path.name}")
    detail = ", ".join(f"{n} {have or 'missing'} (pin {want})" for n, want, have in wrong)
    known = VERSION_FIXES if stack() == "classic" else {}
    fixes = [known.get(n, "").replace("<pin>", w) for n, w, _ in wrong]
    setup = "./run.sh setup" if stack() == "classic" else "HVD_CTSM_STACK=current ./run.sh setup"
    fix = "; ".join(f for f in fixes if f) or f"{setup} installs the pins"
    return Check("package pins", False, detail, cause=f"installed versions differ from {path}",
                 fix=fix)


def check_requirements() -> Check:
    """Installed versions against the ranges the installed hvd_ctsm declares."""
    from packaging.requirements import Requirement

    try:
        declared = [Requirement(r) for r in metadata.requires("hvd_ctsm") or []]
    except metadata.PackageNotFoundError:
        return Check("package versions", False, "no constraints.txt and hvd_ctsm not installed",
                     fix="run from the checkout (./run.sh doctor) or pip install the wheel")
    wrong = []
    for req in declared:
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra's requirement
        have = installed_version(req.name)
        if have is None or not req.specifier.contains(have, prereleases=True):
            wrong.append((req, have))
    if not wrong:
        return Check("package versions", True,
                     f"{len(declared)} requirements of the installed hvd_ctsm are met")
    detail = ", ".join(f"{r.name} {have or 'missing'} (needs {r.specifier or 'any'})"
                       for r, have in wrong)
    return Check("package versions", False, detail, cause="installed versions outside the "
                 "ranges hvd_ctsm declares", fix="pip install the versions named")


def check_dependency_conflicts() -> Check:
    """`pip check`: only the one conflict we chose (petastorm's setuptools<70) may appear."""
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                          timeout=120)
    problems = [line for line in proc.stdout.splitlines()
                if line.strip() and "No broken requirements" not in line]
    unknown = [line for line in problems if not re.search(r"petastorm .* setuptools<70", line)]
    if unknown:
        return Check("dependency conflicts", False, f"{len(unknown)} unexpected",
                     cause="; ".join(unknown[:3]),
                     fix="./run.sh setup reinstalls the pins of constraints.txt")
    if not problems:  # e.g. the current stack, which has no Petastorm
        return Check("dependency conflicts", True, "none (pip check)")
    return Check("dependency conflicts", True, "only the known one: petastorm declares "
                 "setuptools<70, torch >=77; we follow torch (petastorm never imports setuptools)")


def wanted_backends() -> list[str]:
    """HVD_CTSM_BACKENDS (the setup knob): 'torch' when Horovod was left out on purpose, as on
    the current stack."""
    default = "horovod,torch" if stack() == "classic" else "torch"
    return [b.strip() for b in os.environ.get("HVD_CTSM_BACKENDS", default).split(",")
            if b.strip()]


def check_backends() -> Check:
    """Which distributed backends can train here (dist.backend)."""
    from hvd_ctsm.distributed import usable_backends

    why_not = usable_backends()
    usable = [name for name, reason in why_not.items() if not reason]
    missing = [name for name in wanted_backends() if why_not.get(name, "unknown backend")]
    detail = f"usable: {', '.join(usable) or 'none'}"
    if not missing:
        return Check("backends", bool(usable), detail + " (dist.backend=auto: torch under "
                     "torchrun, Horovod under horovodrun)")
    return Check("backends", False, detail, cause="; ".join(
        f"{name}: {why_not.get(name, 'unknown backend')}" for name in missing),
        fix="./run.sh setup installs both; HVD_CTSM_BACKENDS=torch asks for torch only")


def check_spark() -> Check:
    from hvd_ctsm.spark_session import get_spark, java_problem

    problem = java_problem()
    if problem:
        return Check("java + spark", False, problem[0], cause="Spark needs Java 17",
                     fix=problem[1])
    spark = get_spark(master="local[2]", app_name="hvd_ctsm-doctor")
    count = spark.range(1000).selectExpr("sum(id) as s").first()["s"]
    ok = count == 499500
    return Check("java + spark", ok, f"Spark {spark.version}, local[2] sum ok" if ok else
                 f"wrong sum {count}", fix="" if ok else "reinstall pyspark (./run.sh setup)")


def check_petastorm() -> Check:
    """Write a tiny Unischema dataset with Spark and read it back with make_reader."""
    import importlib.util

    if importlib.util.find_spec("petastorm") is None:  # optional: our reader and writer need none
        return Check("petastorm round trip", True, "petastorm is not installed: skipped (only "
                     "Petastorm's own reader and the horovod.spark route need it: "
                     "pip install 'hvd_ctsm[petastorm]' on the classic stack)", skipped=True)
    import numpy as np
    from petastorm import make_reader
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import IntegerType

    from hvd_ctsm.spark_session import get_spark

    schema = Unischema("DoctorRow", [
        UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("seq", np.float32, (None,), NdarrayCodec(), False),
    ])
    spark = get_spark(master="local[2]", app_name="hvd_ctsm-doctor")
    with tempfile.TemporaryDirectory() as tmp:
        url = Path(tmp, "ds").as_uri()
        rows = [dict_to_spark_row(schema, {"id": i, "seq": np.arange(i, dtype=np.float32)})
                for i in range(1, 9)]
        with materialize_dataset(spark, url, schema, row_group_size_mb=1):
            spark.createDataFrame(rows, schema.as_spark_schema()).coalesce(2) \
                .write.mode("overwrite").parquet(url)
        reader = make_reader(url, reader_pool_type="dummy")
        try:
            got = {int(r.id): r.seq.tolist() for r in reader}
        finally:  # not `with`: its exit prints "Cache cleanup complete."
            reader.stop()
            reader.join()
    ok = got == {i: list(map(float, range(i))) for i in range(1, 9)}
    return Check("petastorm round trip", ok, "8 rows written and read back" if ok else
                 f"read back {len(got)} rows, contents differ",
                 fix="" if ok else "check pyarrow==10.0.1 and petastorm==0.13.1")


def run_check(fn, *args) -> Check:
    t0 = time.perf_counter()
    try:
        result = fn(*args)
    except Exception as exc:  # noqa: BLE001  a crashing check is a failed check, with its cause
        name = " ".join([fn.__name__.removeprefix("check_").replace("_", " "), *map(str, args)])
        result = Check(name, False, "raised an error", cause=f"{type(exc).__name__}: {exc}",
                       fix="./run.sh setup reinstalls the stack")
    result.seconds = round(time.perf_counter() - t0, 2)
    return result


def all_checks(skip_slow: bool) -> list:
    horovod = "horovod" in wanted_backends()
    fast = [(check_python,), (check_temp_folder,), (check_omp_threads,), (check_pins,),
            (check_dependency_conflicts,), (check_backends,)]
    fast += [(check_horovod_build,)] if horovod else []
    slow = [(check_allreduce, "gloo"), (check_allreduce, "mpi")] if horovod else []
    slow += [(check_torch_allreduce,), (check_spark,), (check_petastorm,)]
    return fast + ([] if skip_slow else slow) + ([(check_gpu,)] if horovod else [])


def format_line(check: Check) -> str:
    status = "SKIP" if check.skipped else ("OK" if check.ok else "FAIL")
    line = f"{status:<5}{check.name:<31} {check.detail}  ({check.seconds}s)"
    if not check.ok:
        line += f"\n     cause: {check.cause}\n     fix:   {check.fix}"
    return line


@contextmanager
def stdout_to_stderr(enabled: bool):
    """Point file descriptor 1 at stderr (child processes and the JVM included)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser("hvd-ctsm doctor", __doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--skip-slow", action="store_true",
                        help="skip the checks that start processes (allreduce, Spark, Petastorm)")
    args = parser.parse_args(argv)
    checks = []
    # With --json, stdout carries the JSON document alone: what Spark, the JVM or Petastorm print
    # while the checks run goes to stderr.
    with stdout_to_stderr(args.json):
        for fn, *fn_args in all_checks(args.skip_slow):
            checks.append(run_check(fn, *fn_args))
            if not args.json:
                print(format_line(checks[-1]), flush=True)
    failed = [c.name for c in checks if not c.ok]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print("doctor: all checks passed" if not failed else f"doctor: FAILED: {', '.join(failed)}")
    return 1 if failed else 0


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
