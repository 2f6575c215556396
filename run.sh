#!/usr/bin/env bash
# hvd_ctsm: one entry point for every step. `./run.sh help` lists them.
#
# Knobs (environment): NP (training ranks, default 2), CONFIG (trainer YAML preset),
# BACKEND=horovod|torch (the trainer's launcher: horovodrun, or torchrun + DDP with TORCHRUN_ARGS
# and MAX_RESTARTS; default torch on CPU-only hosts, Horovod on GPU hosts where it is installed),
# VENV (default .venv), MASTER (pipeline-spark's Spark master, default local[$NP]),
# SPARK_SUBMIT_ARGS (pipeline-spark's extra spark-submit options, e.g. "--executor-memory 4g"),
# WORK (where demo and pipeline-spark write, default runs/demo), DATA (their events
# source), EPOCHS (their epochs, default 6), GATE (their deploy gate), ROW_GROUPS (the demo's
# row groups per split, default 64; a small DATA needs fewer), TEST_WORKERS (test's pytest
# processes, default 2; 0 runs the suite in one process), HVD_CTSM_STACK=classic|current (which
# stack setup installs and every step uses: classic, the default, is constraints.txt in .venv;
# current is constraints-current.txt in .venv-current, torch backend only; `test` without it
# runs both, as CI does), PYTHON (the interpreter setup creates the venv with: python3.11 by
# default; the current stack also takes 3.12 and 3.13, the first of the three found here).
# Extra arguments are passed on to the step's program.
set -euo pipefail

# A step's paths are the caller's, as `hvd-ctsm STEP` takes them (run.sh works from the
# checkout, so relative ones once named files there): steps run in CALLER, setup and tests here.
CALLER=$PWD
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$REPO"
STACK_CHOSEN=${HVD_CTSM_STACK:+yes}  # test: one stack when chosen, else both
export HVD_CTSM_STACK=${HVD_CTSM_STACK:-classic}
case $HVD_CTSM_STACK in
    classic) export VENV=${VENV:-$REPO/.venv} ;;
    current) export VENV=${VENV:-$REPO/.venv-current} HVD_CTSM_CONSTRAINTS=$REPO/constraints-current.txt \
        HVD_CTSM_BACKENDS=${HVD_CTSM_BACKENDS:-torch} ;;
    *) echo "HVD_CTSM_STACK=$HVD_CTSM_STACK: expected classic or current" >&2; exit 2 ;;
esac
NP=${NP:-2}
VENV=$(realpath -m "$VENV")  # relative: to the checkout, as before (steps run elsewhere)
WORK=$(cd "$CALLER" && realpath -m "${WORK:-$REPO/runs/demo}")
STAMP=$VENV/.hvd_ctsm-setup-stamp

usage() {
    cat <<'EOF'
usage: ./run.sh STEP [args...]

  setup      install the pinned stack into .venv (idempotent; Horovod wheel cached); --if-stale:
             only when the pins or the install script changed since it last ran
  doctor     check the stack: versions, Horovod build, a real 2-rank allreduce, Spark, Petastorm
  demo       the whole chain on synthetic data, on CPU: features -> train (NP ranks) -> backtest -> gate -> deploy -> score
  test       the test suite as CI runs it: the classic stack's every tier, then the current
             stack's unit tier and its tests marked both_stacks (HVD_CTSM_STACK=... : that
             stack's part only); --fast: the unit tier only (about a minute); other arguments
             go to pytest (on the classic stack unless HVD_CTSM_STACK says)
  lint       ruff, isort and hadolint (the Dockerfiles)
  features   the Spark feature job         (hvd-ctsm features ...)
  train      the trainer on NP ranks   (NP=2 ./run.sh train --data DIR ...): torchrun (DDP;
             MAX_RESTARTS=N restarts, none by default) on CPU, horovodrun on GPUs;
             BACKEND=horovod|torch chooses
  backtest   offline evaluation + gate     (hvd-ctsm backtest ...)
  gate       apply a deploy gate to a backtest report (hvd-ctsm gate ...)
  deploy     copy a gated model into the registry (hvd-ctsm deploy ...)
  score      top-K unseen items per client, Parquet (hvd-ctsm score ...)
  pipeline-spark  the whole chain as one Spark application (spark-submit spark_jobs/pipeline.py)
  elastic    elastic training on this machine (horovodrun --min-np 1 --max-np 2, see docs/ELASTIC.md)
  bench      every benchmark, then benchmarks/RESULTS.md (~1 h on 2 cores; --only; --quick
             writes runs/bench-quick/ instead)
EOF
}

# A fingerprint of everything that decides what setup installs: rerun setup when it changes.
setup_fingerprint() {
    echo "stack=$HVD_CTSM_STACK"
    cat constraints.txt setup.cfg scripts/install_stack.sh | sha256sum | cut -d' ' -f1
    if [[ $HVD_CTSM_STACK == current ]]; then sha256sum <constraints-current.txt | cut -d' ' -f1; fi
    if [[ -n ${PYTHON:-} ]]; then echo "python=$PYTHON"; fi  # a Python asked for: setup checks it
}

setup() {
    refuse_another_stack
    bash scripts/install_stack.sh
    setup_fingerprint >"$STAMP"
}

# One stack's pins installed over the other's leave a venv that is neither (Horovod and
# Petastorm stay beside Spark 4, say): one line and exit 2 instead.
refuse_another_stack() {
    local holds
    holds=$(sed -n 's/^stack=//p' "$STAMP" 2>/dev/null || true)
    if [[ -n $holds && $holds != "$HVD_CTSM_STACK" ]]; then
        echo "run.sh: $VENV holds the $holds stack, not the $HVD_CTSM_STACK one: set" \
            "HVD_CTSM_STACK=$holds to use it, or VENV= another folder" >&2
        exit 2
    fi
}

# Setup runs by itself only into a venv it made (the stamp, or install_stack.sh's marker of a
# setup cut short) for the stack asked for: pointing VENV at another stack's venv or at an
# environment of one's own says so in one line instead of installing other pins into it.
ensure_setup() {
    [[ -f $STAMP && $(cat "$STAMP") == "$(setup_fingerprint)" ]] && return
    refuse_another_stack
    if [[ -x $VENV/bin/python && ! -f $STAMP && ! -f $VENV/.hvd_ctsm-venv ]]; then
        echo "run.sh: $VENV was not made by ./run.sh setup, which would install the" \
            "$HVD_CTSM_STACK stack's pins into it: run ./run.sh setup with this VENV to do that," \
            "or leave VENV unset" >&2
        exit 2
    fi
    echo "[run.sh] environment missing or stale: running setup first"
    setup
}

py() { "$VENV/bin/python" "$@"; }

# Every step is the package's one command, `hvd-ctsm STEP` (its console script, hvd_ctsm.cli);
# this script adds only setup, the environment and the launchers (horovodrun, torchrun, Spark).
step() { in_caller "$VENV/bin/hvd-ctsm" "$@"; }

in_caller() { (cd "$CALLER" && "$@"); }

# Horovod launcher: Gloo on this one host; extra horovodrun flags via HOROVODRUN_ARGS.
hvdrun() {
    need_horovod "BACKEND=horovod"
    # shellcheck disable=SC2086
    launched horovodrun -np "$NP" --gloo ${HOROVODRUN_ARGS:-} "$@"
}

# One line and exit 2 where a Horovod route is asked for and the venv has no Horovod.
need_horovod() {
    [[ -x $VENV/bin/horovodrun ]] && return
    echo "run.sh: $1 needs Horovod, which the $HVD_CTSM_STACK stack's venv ($VENV) has not: use" \
        "the classic stack (./run.sh setup; HVD_CTSM_STACK=classic) or the torch backend" >&2
    exit 2
}

# The torch backend's launcher: NP workers on this host (--standalone picks a free port), restarted
# MAX_RESTARTS times from the latest checkpoint when one fails. On several hosts, TORCHRUN_ARGS
# replaces --standalone (e.g. "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint HOST:29400").
torchrun_launch() {
    # OMP_NUM_THREADS=1 is torchrun's own default, set here so that it prints no banner about it;
    # each rank then takes dist.threads_per_rank threads (cores / ranks unless set).
    # shellcheck disable=SC2086
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" launched torchrun ${TORCHRUN_ARGS:---standalone} \
        --nproc-per-node "$NP" --max-restarts "${MAX_RESTARTS:-0}" "$@"
}

# A launcher (torchrun or horovodrun) and its arguments, run by hvd_ctsm/distributed/launchers.py:
# when workers fail it ends in one line and the exit code of errors.py's table they mean, not
# the launcher's traceback and its 1 for any failure.
launched() { in_caller "$VENV/bin/python" -m hvd_ctsm.distributed.launchers "$@"; }

# BACKEND picks the trainer's launcher. Without it: torch on a CPU-only host (DDP overlaps the
# gradient reduction with backward, Horovod waits for it after: torch trained 4-7% faster in
# benchmarks/backends.py), Horovod where there are GPUs and it is installed, else torch.
trainer_backend() {
    if [[ -n ${BACKEND:-} ]]; then echo "$BACKEND"
    elif [[ -x $VENV/bin/horovodrun ]] && has_gpu; then echo horovod
    else echo torch
    fi
}

has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

# NP=0 under horovodrun ran nothing and exited 0 (a script took it for a finished run);
# torchrun answered NP=abc with its traceback and 1 ("refused" in errors.py's table).
check_np() {
    [[ $NP =~ ^[1-9][0-9]*$ ]] && return
    echo "run.sh: NP=$NP: the number of training ranks must be a whole number >= 1" >&2
    exit 2
}

train_launch() {
    if [[ " $* " == *" --print-config "* ]]; then step train "$@"; return; fi  # once, no ranks
    check_np
    # One check before any launcher starts: a bad value is one line and exit 2 here, instead of
    # one line per rank and then the launcher's own report of failed workers.
    step train --check --ranks "$NP" "$@" >/dev/null
    case $(trainer_backend) in
        torch) torchrun_launch --no-python "$VENV/bin/hvd-ctsm" train "$@" ;;
        horovod) hvdrun "$VENV/bin/hvd-ctsm" train "$@" ;;
        *) echo "BACKEND=$BACKEND: use BACKEND=horovod or BACKEND=torch (or leave it unset)" >&2
           exit 2 ;;
    esac
}

demo() {
    ensure_setup
    local data=$WORK/features model=$WORK/model registry=$WORK/registry
    local source=${DATA:-synthetic:clients=1200,items=300,events=60000,seed=7}
    # The trainer's config before the features' minutes: CONFIG=nosuch or EPOCHS=abc in a line
    step train --config "${CONFIG:-default}" "epochs=${EPOCHS:-6}" "$@" --print-config >/dev/null
    echo "[demo] 1/6 features: $source -> $data"
    step features --source "$source" --out "$data" --split leave-last-out \
        --row-groups "${ROW_GROUPS:-64}" --master "local[2]" --overwrite
    echo "[demo] 2/6 train: $NP ranks, $(trainer_backend) backend (Gloo, CPU)"
    train_launch --data "$data" --out "$model" --config "${CONFIG:-default}" \
        --overwrite "epochs=${EPOCHS:-6}" "$@"
    echo "[demo] 3/6 backtest"
    step backtest --data "$data" --model "$model" --report "$model/backtest.json"
    echo "[demo] 4/6 gate"
    step gate --report "$model/backtest.json" --gate "${GATE:-ndcg@10>=0.05}"
    echo "[demo] 5/6 deploy"
    step deploy --model "$model" --report "$model/backtest.json" --registry "$registry"
    echo "[demo] 6/6 score: top-10 per client from the deployed model"
    step score --data "$data" --model "$registry" --out "$WORK/scores.parquet" --k 10
    if [[ -f $WORK/mlflow/mlflow.db ]]; then  # tracking on (the default) and mlflow installed
        echo "[demo] MLflow run, metrics and models:/ctsm@champion in $WORK/mlflow; browse them with:"
        echo "       $VENV/bin/mlflow ui --backend-store-uri sqlite:///$WORK/mlflow/mlflow.db"
    fi
}

# The Spark route: one spark-submit application (features, horovod.spark training, backtest,
# gate, deploy). The venv's bin goes first on PATH so that executors run its python. MASTER picks
# the cluster (MASTER=spark://head:7077), default local[$NP]; SPARK_SUBMIT_ARGS adds spark-submit's
# own options (executor cores and memory, --py-files); extra arguments go to pipeline.py.
# The driver logs as the sessions hvd_ctsm starts itself do (hvd_ctsm/spark_session.py:
# quiet_start): warnings, not the 40 INFO lines of Spark's start, unless SPARK_SUBMIT_ARGS sets
# the driver's Java options; in local mode it binds to the loopback address.
pipeline_spark() {
    check_np
    ensure_setup
    local source=${DATA:-synthetic:clients=1200,items=300,events=60000,seed=7}
    local master=${MASTER:-local[$NP]} quiet=()
    case "${SPARK_SUBMIT_ARGS:-}" in
        *driver-java-options*|*driver.extraJavaOptions*) ;;
        *) quiet=(--driver-java-options
                  "-Dlog4j2.configurationFile=file:$REPO/hvd_ctsm/spark_log4j2.properties") ;;
    esac
    case "$master" in local*) export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1} ;; esac
    # shellcheck disable=SC2086
    PATH="$VENV/bin:$PATH" PYSPARK_PYTHON="$VENV/bin/python" in_caller "$VENV/bin/spark-submit" \
        --master "$master" "${quiet[@]}" ${SPARK_SUBMIT_ARGS:-} \
        "$REPO/spark_jobs/pipeline.py" --source "$source" --work "$WORK/pipeline" \
        --registry "$WORK/registry" --num-proc "$NP" --config "${CONFIG:-default}" \
        --gate "${GATE:-ndcg@10>=0.05}" "epochs=${EPOCHS:-6}" "$@"
}

# Elastic Horovod on one machine: two host names for it (scripts/local_hosts.sh), the loopback
# interface, and a cooldown after which a failed worker's host is tried again (it rejoins).
# On a cluster, point HOSTS_SCRIPT at a script that prints the live hosts.
# The default host script names this machine twice, which Horovod takes for two hosts of one
# rank each: each rank then took every core (2 ranks on 2 cores: 8x slower steps, measured), so
# each gets its half here; a later dist.threads_per_rank=N of the command's wins.
elastic() {
    need_horovod "elastic training"
    local threads=()
    if [[ -z ${HOSTS_SCRIPT:-} ]]; then
        threads=("dist.threads_per_rank=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))")
    fi
    # The checks rank 0 makes, once and first: a refused run folder left rank 1 waiting 30 s
    step train --elastic --check ${CONFIG:+--config "$CONFIG"} "$@" >/dev/null
    launched horovodrun -np 2 --min-np 1 --max-np 2 \
        --host-discovery-script "${HOSTS_SCRIPT:-$REPO/scripts/local_hosts.sh}" \
        --network-interface lo --blacklist-cooldown-range 10 60 --gloo \
        "$VENV/bin/python" -m hvd_ctsm.train --elastic ${CONFIG:+--config "$CONFIG"} \
        "${threads[@]}" "$@"
}

run_tests() {
    if [[ $# -eq 0 && -z $STACK_CHOSEN ]]; then
        # Both stacks, each from its own venv: the nested runs choose theirs (VENV and the
        # stack's other settings are set again there, not inherited from this one).
        local start=$SECONDS
        local stack=(env -u VENV -u HVD_CTSM_CONSTRAINTS -u HVD_CTSM_BACKENDS)
        echo "[run.sh] test: the classic stack (every tier), then the current stack (the unit" \
            "tier and the tests marked both_stacks)"
        # The classic setup first and alone: both setups write the same cache's logs.
        "${stack[@]}" HVD_CTSM_STACK=classic "$REPO/run.sh" setup --if-stale
        # The current stack's setup (pip, bytecode: 1-2 minutes) runs beside the classic tests
        # at the lowest CPU priority, on the idle time they leave (about a tenth of 2 cores).
        local log=$REPO/runs/current-stack-setup.log
        mkdir -p "$REPO/runs"
        echo "[run.sh] test: the current stack's setup runs meanwhile (log: $log)"
        # In a session of its own, so that a failing classic part stops it, pip included.
        "${stack[@]}" HVD_CTSM_STACK=current setsid nice -n 19 "$REPO/run.sh" setup --if-stale \
            >"$log" 2>&1 &
        local current_setup=$!
        trap "kill -- -$current_setup 2>/dev/null || true" EXIT
        "${stack[@]}" HVD_CTSM_STACK=classic "$REPO/run.sh" test
        echo "[run.sh] test: classic stack done in $((SECONDS - start)) s"
        if ! wait "$current_setup"; then
            cat "$log" >&2
            echo "[run.sh] test: the current stack's setup failed (its log is above)" >&2
            return 1
        fi
        trap - EXIT
        echo "[run.sh] test: the current stack's setup, run meanwhile:"
        cat "$log"
        "${stack[@]}" HVD_CTSM_STACK=current "$REPO/run.sh" test
        echo "[run.sh] test: both stacks passed in $((SECONDS - start)) s"
        return
    fi
    ensure_setup
    # Each Horovod rank and Spark would otherwise start one thread per core and fight.
    # TEST_WORKERS pytest processes (pytest-xdist), each running whole test files; 0 runs the
    # suite in this process. With no arguments: the unit tier first (about a minute; a failure
    # there stops before the slow tiers start), then every other tier (on the current stack:
    # the tests marked both_stacks, those that depend on the stack; the rest ran on the classic).
    local pytest=(env OMP_NUM_THREADS=1 "$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-2}"
        --dist loadfile)
    if [[ $# -gt 0 ]]; then
        "${pytest[@]}" "$@"
        return
    fi
    local heavy=(--heavy)
    [[ $HVD_CTSM_STACK == current ]] && heavy+=(-m both_stacks)
    echo "[run.sh] test ($HVD_CTSM_STACK stack): the unit tier first, then ${heavy[*]}"
    "${pytest[@]}" --fast && "${pytest[@]}" "${heavy[@]}"
}

main() {
    local step=${1:-help}
    shift || true
    case $step in
        setup) if [[ ${1:-} == --if-stale ]]; then ensure_setup; else setup; fi ;;
        doctor) ensure_setup; step doctor "$@" ;;
        demo) demo "$@" ;;
        test) run_tests "$@" ;;
        lint) ensure_setup; py -m ruff check . && py -m isort --check-only --diff . &&
            "$VENV/bin/hadolint" docker/Dockerfile.* ;;
        features) ensure_setup; step features "$@" ;;
        train) ensure_setup; train_launch ${CONFIG:+--config "$CONFIG"} "$@" ;;
        backtest) ensure_setup; step backtest "$@" ;;
        deploy) ensure_setup; step deploy "$@" ;;
        elastic) ensure_setup; elastic "$@" ;;
        bench) ensure_setup; PATH="$VENV/bin:$PATH" py benchmarks/run_all.py "$@" ;;
        gate) ensure_setup; step gate "$@" ;;
        score) ensure_setup; step score "$@" ;;
        pipeline-spark) pipeline_spark "$@" ;;
        help | -h | --help) usage ;;
        *) echo "unknown step: $step" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
