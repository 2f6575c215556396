#!/usr/bin/env bash
# Installs the pinned stack: system packages, a Python 3.11 virtual environment, the pins of
# constraints.txt, Horovod 0.28.1 built from its sdist with the C++17 fix, and this project.
# Idempotent: each step checks first and skips what is already in place. The Docker images run
# the same script, so there is one recipe.
#
# Knobs (environment):
#   VENV               where the virtual environment goes (default: .venv in the repo)
#   HVD_CTSM_CACHE     where the built Horovod wheel is cached (default: ~/.cache/hvd_ctsm)
#   PYTHON             the interpreter that creates the venv (default: python3.11; the current
#                      stack also takes 3.12 and 3.13, as hvd_ctsm/doctor.py's VERIFIED_PYTHONS,
#                      and uses the first of them that runs here when PYTHON is unset)
#   SKIP_APT=1         do not touch system packages (containers that preinstalled them)
#   HOROVOD_GPU_OPERATIONS=NCCL   build Horovod's NCCL path (GPU machines; cached separately)
#   HVD_CTSM_BACKENDS=torch       the torch backend only (torchrun + DDP): no MPI packages and no
#                      Horovod build (the slow step); default horovod,torch installs both
#   HVD_CTSM_STACK=current        the current stack instead (constraints-current.txt: PySpark 4,
#                      pyarrow >= 15, numpy 2, pandas 3; no Horovod or Petastorm, so the torch
#                      backend only); default classic (constraints.txt)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$REPO/.venv}
CACHE=${HVD_CTSM_CACHE:-$HOME/.cache/hvd_ctsm}
PYTHON_CHOSEN=${PYTHON:+yes}  # unset: an existing venv of any verified Python is kept
PYTHON=${PYTHON:-python3.11}
CONSTRAINTS=$REPO/constraints.txt
APT_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make openjdk-17-jre-headless procps)
BACKENDS=${HVD_CTSM_BACKENDS:-horovod,torch}
STACK=${HVD_CTSM_STACK:-classic}
PYTHONS="3.11"  # the classic stack's pyarrow 10 has no wheels for a later Python
case $STACK in
    classic) ;;
    current)
        CONSTRAINTS=$REPO/constraints-current.txt
        PYTHONS="3.11 3.12 3.13"
        if [[ ${HVD_CTSM_BACKENDS:-torch} != torch ]]; then
            echo "[setup] HVD_CTSM_STACK=current has no Horovod: leave HVD_CTSM_BACKENDS unset" >&2
            exit 2
        fi
        BACKENDS=torch ;;
    *) echo "[setup] HVD_CTSM_STACK=$HVD_CTSM_STACK: expected 'classic' or 'current'" >&2; exit 2 ;;
esac
case $BACKENDS in
    horovod,torch | torch,horovod) ;;
    torch) APT_PACKAGES=(openjdk-17-jre-headless procps) ;;  # MPI and compilers are Horovod's
    *) echo "[setup] HVD_CTSM_BACKENDS=$BACKENDS: expected 'torch' or 'horovod,torch'" >&2; exit 2 ;;
esac

python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# Unset, PYTHON is the first of the stack's Pythons that runs here: python3.11 where it is, else
# the current stack takes the machine's python3.12 (Ubuntu 24.04) or python3.13 as it is.
if [[ -z $PYTHON_CHOSEN ]]; then
    for version in $PYTHONS; do
        if python_version "python$version" >/dev/null; then PYTHON=python$version; break; fi
    done
fi

pin() { sed -n "s/^$1==//p" "$CONSTRAINTS"; }
HOROVOD_VERSION=$(pin horovod)
TORCH_VERSION=$(pin torch)

step_name=""
step_start=0
step() {
    step_name=$1
    step_start=$(date +%s)
    printf '[setup] %-44s ' "$step_name..."
}
done_step() { printf 'done (%ss)%s\n' "$(($(date +%s) - step_start))" "${1:+ $1}"; }
fail() {
    printf 'FAILED\n[setup] step "%s" failed: %s\n[setup] fix: %s\n' "$step_name" "$1" "$2" >&2
    exit 1
}

install_system_packages() {
    step "system packages (${APT_PACKAGES[*]})"
    if [[ ${SKIP_APT:-0} == 1 ]]; then done_step "(skipped: SKIP_APT=1)"; return; fi
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then done_step "(already installed)"; return; fi
    local sudo=""
    [[ $(id -u) != 0 ]] && sudo="sudo"
    { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q \
        --no-install-recommends "${missing[@]}"; } >"$CACHE/apt.log" 2>&1 ||
        fail "apt-get could not install ${missing[*]} (log: $CACHE/apt.log)" \
            "run as root or with sudo, or install them yourself and rerun with SKIP_APT=1"
    done_step "(installed ${missing[*]})"
}

create_venv() {
    step "virtual environment ($VENV)"
    local wanted=""
    if [[ -n $PYTHON_CHOSEN || ! -x $VENV/bin/python ]]; then
        command -v "$PYTHON" >/dev/null ||
            fail "$PYTHON not found" "install Python ${PYTHONS%% *} or point PYTHON= at one of: $PYTHONS"
        wanted=$(python_version "$PYTHON") || fail "$PYTHON did not start" "point PYTHON= elsewhere"
        [[ " $PYTHONS " == *" $wanted "* ]] ||
            fail "$PYTHON is Python $wanted; the $STACK stack is verified on $PYTHONS" \
                "point PYTHON= at one of those"
    fi
    if [[ -x $VENV/bin/python ]]; then
        local has
        has=$(python_version "$VENV/bin/python") || has="?"
        if [[ " $PYTHONS " == *" $has "* && ( -z $wanted || $has == "$wanted" ) ]]; then
            done_step "(exists, Python $has)"; return
        fi
        fail "$VENV holds Python $has, not ${wanted:-one of $PYTHONS}" \
            "remove $VENV (or set VENV= elsewhere) to create it anew${wanted:+, or set PYTHON= to match it}"
    fi
    "$PYTHON" -m venv "$VENV" || fail "could not create the venv" "install python$wanted-venv"
    : >"$VENV/.hvd_ctsm-venv"  # made here: run.sh sets up into it again without asking
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    done_step
}

# --no-compile: pip would byte-compile every file of every package (torch, Spark, MLflow...);
# Python compiles the few that are imported on first use instead. Side by side here, installing
# the MLflow and S3 pins took 83-97 s with it against 132-150 s without.
pip_install() { "$VENV/bin/python" -m pip install -q --no-compile -c "$CONSTRAINTS" "$@"; }

install_pinned_stack() {
    step "pinned Python packages (${CONSTRAINTS##*/})"
    # torch first and alone: with it present, nothing later can pull a CUDA build.
    pip_install "torch==$TORCH_VERSION" >"$CACHE/pip.log" 2>&1 ||
        fail "torch==$TORCH_VERSION did not install (log: $CACHE/pip.log)" \
            "point PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index, or preinstall that torch"
    local names
    # moto with its S3 extra (the tests' local S3 server); a constraints file cannot name extras.
    names=$(grep -E '^[A-Za-z0-9_.-]+==' "$CONSTRAINTS" | cut -d= -f1 | grep -vxE 'torch|horovod|petastorm' |
        sed 's/^moto$/moto[s3]/')
    # shellcheck disable=SC2086
    pip_install $names >>"$CACHE/pip.log" 2>&1 ||
        fail "pip could not install the pins (log: $CACHE/pip.log)" \
            "read the log's last lines; a pin that no longer exists must be changed in constraints.txt"
    # --no-deps: petastorm's setuptools<70 clashes with torch's >=77 (see constraints.txt).
    if [[ -n $(pin petastorm) ]]; then  # the current stack has none
        pip_install --no-deps "petastorm==$(pin petastorm)" >>"$CACHE/pip.log" 2>&1 ||
            fail "petastorm did not install (log: $CACHE/pip.log)" "check the petastorm pin"
    fi
    done_step
}

horovod_wheel_dir() {
    local ops=${HOROVOD_GPU_OPERATIONS:-cpu}
    echo "$CACHE/wheels/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-py311-${ops,,}"
}

build_horovod_wheel() {
    local out=$1 work
    work=$(mktemp -d)
    "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$work" \
        "horovod==$HOROVOD_VERSION" >"$CACHE/horovod-build.log" 2>&1 ||
        fail "could not download the horovod $HOROVOD_VERSION sdist" "check the package index is reachable"
    tar -xzf "$work"/horovod-*.tar.gz -C "$work"
    local src=$work/horovod-$HOROVOD_VERSION
    # PyTorch >= 2.1 headers need C++17; 0.28.1 asks for C++14 (fixed upstream after the release).
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" ||
        fail "the C++17 patch did not apply" "the sdist layout changed; patch CMAKE_CXX_STANDARD by hand"
    # cmake 4 (from PyPI) refuses the bundled Gloo's old minimum version; allow it if present.
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
        "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" \
        >>"$CACHE/horovod-build.log" 2>&1 ||
        fail "Horovod did not compile (log: $CACHE/horovod-build.log)" \
            "'C++17 or later' means the patch is missing; 'CMake < 3.5' means use the system cmake 3.25; 'mpi.h' means install libopenmpi-dev"
    mkdir -p "$out"
    mv "$work"/dist/horovod-*.whl "$out/"
    rm -rf "$work"
}

install_horovod() {
    if [[ $BACKENDS == torch ]]; then
        step "horovod"
        done_step "(skipped: HVD_CTSM_BACKENDS=torch)"
        return
    fi
    step "horovod $HOROVOD_VERSION (C++17 build, cached wheel)"
    local dir note="(from cache)"
    dir=$(horovod_wheel_dir)
    local nccl_check=""  # a GPU build must really have NCCL, not just any installed Horovod
    [[ ${HOROVOD_GPU_OPERATIONS:-} == NCCL ]] && nccl_check="; assert horovod.torch.nccl_built()"
    if "$VENV/bin/python" -c "import horovod.torch, horovod; assert horovod.__version__ == '$HOROVOD_VERSION'$nccl_check" 2>/dev/null; then
        done_step "(installed)"; return
    fi
    if ! ls "$dir"/horovod-*.whl >/dev/null 2>&1; then
        printf '\n[setup]   building from source once (2-3 minutes on 2 cores)... '
        build_horovod_wheel "$dir"
        note="(built, cached in $dir)"
    fi
    "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$dir"/horovod-*.whl \
        >>"$CACHE/pip.log" 2>&1 || fail "the cached wheel did not install" "delete $dir and rerun setup"
    done_step "$note"
}

install_project() {
    step "this project (pip install -e .)"
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$REPO" \
        >>"$CACHE/pip.log" 2>&1 || fail "pip install -e . failed (log: $CACHE/pip.log)" "check setup.cfg"
    done_step
}

# Python keeps an import's compiled bytecode (.pyc) beside the source only when it may write it.
# Where PYTHONDONTWRITEBYTECODE is set (many containers and CI images) or site-packages is
# read-only, pip leaves none and every process compiles torch, mlflow and the rest again: about
# 4 s of a core for torch, 5 s for mlflow, in each rank, launcher and Spark Python worker (the
# test suite starts hundreds). Compile once here. A few packages ship files that are not Python 3
# (templates, old test data), which compileall reports: the check is that torch's compiled.
compile_bytecode() {
    step "bytecode, compiled once"
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$VENV/bin/python" -m compileall -q -j 0 "$site" "$REPO/hvd_ctsm" "$REPO/spark_jobs" \
        >>"$CACHE/compileall.log" 2>&1 || true
    "$VENV/bin/python" -c 'import importlib.util as u, os, sys
spec = u.find_spec("torch")
sys.exit(not os.path.exists(u.cache_from_source(spec.origin)))' ||
        fail "no compiled bytecode for torch (log: $CACHE/compileall.log)" \
            "check that $site is writable"
    done_step
}

main() {
    mkdir -p "$CACHE"
    local t0
    t0=$(date +%s)
    install_system_packages
    create_venv
    install_pinned_stack
    install_horovod
    install_project
    compile_bytecode
    echo "[setup] ready in $(($(date +%s) - t0))s: $VENV (activate with: source $VENV/bin/activate)"
}

main "$@"
