#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step_* functions run through run_step (bash -c "$fn")
# The checks that need a real CUDA GPU, in one go, in under 10 minutes (one H200-class card,
# 16 cores, a fresh checkout). Run from anywhere:
#
#     bash bench/gpu_check.sh            # results in $OUT if set, else gpu-check-out/<time>/
#
# Steps (each with its own time limit, its output in <results>/<step>.log; a failed or timed
# out step is recorded and the next one still runs, except after a failed install):
#   env        nvidia-smi, cores, memory, Python, git revision
#   install    a virtualenv ($GPU_VENV, default .venv-gpu) with the CUDA build of the
#              pinned torch from $TORCH_INDEX_URL (default the cu128 wheel index), then
#              pyproject's dependencies with tensorflow-cpu swapped for the [gpu] extra
#              (tensorflow[and-cuda]), pytest and pandas, then docintel itself without
#              dependencies: README "GPU install" done as infra/Dockerfile.cuda does it, so
#              tensorflow-cpu never lands beside tensorflow. Reused when it already imports
#              docintel and torch sees CUDA. WHEELHOUSE=/dir installs offline from wheels.
#   gpu-tests  pytest -m gpu tests/gpu (torch fraction cap, TF memory limit, three stages
#              on one card); fails loudly if torch sees no GPU
#   quantize   docintel quantize (the int8 CPU models), in the background during gpu-tests
#   stages     sentences/s of embed in bf16 and fp16 (torch) and classify (TF) on the GPU
#              vs the CPU-int8 spill replicas (ONNX Runtime, all cores and 1 core), each in
#              its own process, with each framework's peak device memory (bench/gpu_stages.py)
#   one-card   the demo corpus through all three stages on one card (`docintel run --gpus 1
#              --spill gpu-only`), nvidia-smi sampled every 0.5 s: peak memory per actor
#              process, i.e. per framework (spaCy, torch, TensorFlow), and of the whole card
#   control    the control plane at real speed: one card, real replicas of the three
#              stages, "auto" batches, one-sentence and news-like corpora: sentences/s,
#              the replicas' busy share, the driver's CPU seconds (issue 19)
#   spill      bench/spill.py with real GPU replicas: a stand-in GPU node (the real card,
#              cores 0-3) and a CPU node (the other cores), gpu-only / cpu-only / auto and
#              auto with one batch in flight
# The script ends with <results>/summary.md (status of each step and the result tables)
# and exits 1 if any step failed. At most 8 files are written to <results>.
#
# Environment: OUT, GPU_VENV, PYTHON (default python3, >= 3.11), TORCH_INDEX_URL,
# WHEELHOUSE, DEADLINE_S (default 570: the whole run, steps get what is left).
# After a step times out, `ray stop --force` clears the Ray processes it left: the script
# assumes a machine dedicated to this check.

set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

export REPO
export RESULTS=${OUT:-$REPO/gpu-check-out/$(date -u +%Y%m%dT%H%M%SZ)}
export VENV=${GPU_VENV:-$REPO/.venv-gpu}
export PYTHON=${PYTHON:-python3}
export TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}
export WHEELHOUSE=${WHEELHOUSE:-}
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=2
DEADLINE_S=${DEADLINE_S:-570}
export WORK
WORK=$(mktemp -d -t docintel-gpu-check.XXXXXX)
STATUS="$WORK/status.md"
SUMMARY="$RESULTS/summary.md"
mkdir -p "$RESULTS"
: > "$STATUS"

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }

cleanup_ray() {
    if [[ -x $VENV/bin/ray ]]; then
        "$VENV/bin/ray" stop --force > /dev/null 2>&1 || true
    fi
}

# run_step NAME BUDGET_S FUNCTION: run FUNCTION under `timeout` (at most BUDGET_S, and never
# past the deadline), its output in $RESULTS/NAME.log, its status a row of $STATUS.
run_step() {
    local name=$1 budget=$2 fn=$3
    local left=$((DEADLINE_S - SECONDS))
    local limit=$((budget < left ? budget : left))
    local logf="$RESULTS/$name.log"
    if ((limit < 20)); then
        printf '| %s | skipped: %ss left of %ss | 0 s |\n' "$name" "$left" "$DEADLINE_S" >> "$STATUS"
        log "step $name skipped: ${left}s left"
        return 1
    fi
    log "step $name (limit ${limit}s) -> $logf"
    local t0=$SECONDS rc=0 verdict=ok
    timeout --kill-after=15 "$limit" bash -c "set -euo pipefail; $fn" > "$logf" 2>&1 || rc=$?
    case $rc in
        0) ;;
        124 | 137)
            verdict="TIMEOUT after ${limit} s"
            cleanup_ray
            ;;
        *) verdict="FAILED (exit $rc)" ;;
    esac
    printf '| %s | %s | %s s |\n' "$name" "$verdict" "$((SECONDS - t0))" >> "$STATUS"
    log "step $name: $verdict ($((SECONDS - t0)) s)"
    return "$rc"
}

step_env() {
    date -u
    git -C "$REPO" rev-parse HEAD || true
    git -C "$REPO" status --short | head -20 || true
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
    echo "cores: $(nproc)"
    free -g
    "$PYTHON" --version
    uptime
}

step_install() {
    local py="$VENV/bin/python"
    if [[ -x $py ]] && "$py" -c 'import torch, sys, docintel.pipeline; sys.exit(not torch.cuda.is_available())'; then
        echo "reusing $VENV (docintel imports, torch sees CUDA)"
    else
        "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed, not " + sys.version)'
        "$PYTHON" -m venv "$VENV"
        local -a pip=("$py" -m pip install --disable-pip-version-check --progress-bar off)
        local -a torch_from=(--index-url "$TORCH_INDEX_URL")
        if [[ -n $WHEELHOUSE ]]; then
            pip+=(--no-index --find-links "$WHEELHOUSE")
            torch_from=()
        fi
        "${pip[@]}" --upgrade pip
        local torch_pin
        torch_pin=$(grep -o '"torch==[^"]*"' "$REPO/pyproject.toml" | tr -d '"')
        "${pip[@]}" "$torch_pin" "${torch_from[@]}"
        # pyproject's pins, tensorflow-cpu swapped for the [gpu] extra; pytest, pandas (dev)
        "$py" - "$REPO/pyproject.toml" > "$WORK/requirements-cuda.txt" << 'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = [d for d in p["dependencies"] if not d.startswith("tensorflow-cpu")]
deps += p["optional-dependencies"]["gpu"]
deps += [d for d in p["optional-dependencies"]["dev"] if d.startswith(("pytest", "pandas"))]
print("\n".join(deps))
PY
        cat "$WORK/requirements-cuda.txt"
        "${pip[@]}" -r "$WORK/requirements-cuda.txt"
        "${pip[@]}" --no-deps -e "$REPO"
    fi
    "$py" -m pip list 2> /dev/null | grep -Ei '^(torch|tensorflow|keras|ray|onnxruntime|nvidia-cudnn)' || true
    if "$py" -m pip show tensorflow-cpu > /dev/null 2>&1; then
        echo "tensorflow-cpu is installed beside tensorflow: remove $VENV and rerun" >&2
        exit 1
    fi
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0)); assert torch.cuda.is_available()'
    "$py" -c 'import tensorflow as tf; gpus = tf.config.list_physical_devices("GPU"); print("tensorflow", tf.__version__, gpus); assert gpus'
}

step_gpu_tests() {
    "$VENV/bin/python" -m pytest -m gpu tests/gpu -v -p no:cacheprovider
}

step_quantize() {
    "$VENV/bin/docintel" quantize
}

step_stages() {
    local py="$VENV/bin/python" jsonl="$WORK/stages.jsonl"
    : > "$jsonl"
    # stage device precision threads sentences
    local -a variants=(
        "embed gpu bf16 0 47760"
        "embed gpu fp16 0 47760"
        "embed cpu int8 0 9552"
        "embed cpu int8 1 2388"
        "classify gpu fp32 0 95520"
        "classify cpu int8 1 95520"
    )
    local v failed=0
    for v in "${variants[@]}"; do
        read -r stage device precision threads sentences <<< "$v"
        echo "--- $v"
        "$py" bench/gpu_stages.py --stage "$stage" --device "$device" --precision "$precision" \
            --threads "$threads" --sentences "$sentences" --json-out "$jsonl" || failed=1
    done
    echo
    "$py" bench/gpu_stages.py --summarize "$jsonl" | tee "$WORK/stages.md"
    return "$failed"
}

step_one_card() {
    local py="$VENV/bin/python" samples="$WORK/one-card.csv"
    printf '[resources.%s]\ngpu_replicas = 1\n' sentencize embed classify > "$WORK/one-card.toml"
    (
        while :; do
            ts=$(date +%s.%N)
            { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2> /dev/null || true; } |
                while IFS=', ' read -r pid mem; do
                    echo "$ts,$pid,$mem,$(ps -o args= -p "$pid" 2> /dev/null | cut -c1-80 || true)"
                done
            echo "$ts,card,$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1),"
            sleep 0.5
        done
    ) > "$samples" &
    local sampler=$!
    local rc=0
    "$VENV/bin/docintel" run data/demo/documents.parquet "$WORK/one-card-out" --gpus 1 \
        --spill gpu-only --config "$WORK/one-card.toml" --no-progress --run-id one-card || rc=$?
    kill "$sampler" 2> /dev/null || true
    wait "$sampler" 2> /dev/null || true
    "$py" - "$samples" "$WORK/one-card-out/_manifest.json" << 'PY' | tee "$WORK/one-card.md"
import collections, json, sys
# one actor class hosts every stage: the manifest's replicas name each process's stage
stage_of = {}
try:
    for r in json.load(open(sys.argv[2]))["replicas"]:
        stage_of[str(r.get("pid"))] = f"{r['stage']} {r['pool']} ({r['backend']})"
except (OSError, ValueError, KeyError):
    pass
peak, card = collections.defaultdict(float), 0.0
for line in open(sys.argv[1]):
    parts = line.rstrip("\n").split(",", 3)
    if len(parts) < 4 or not parts[2].strip().isdigit():
        continue
    _, pid, mem, title = parts
    if pid == "card":
        card = max(card, float(mem))
        continue
    who = stage_of.get(pid.strip(), f"pid {pid}: {title.strip() or '?'}")
    peak[who] = max(peak[who], float(mem))
print("| process | peak GPU memory MiB (nvidia-smi) |")
print("| --- | ---: |")
for who, mb in sorted(peak.items()):
    print(f"| {who} | {mb:.0f} |")
print(f"| whole card (memory.used) | {card:.0f} |")
if not peak:
    print("\n(no per-process rows: nvidia-smi shows no compute processes in this PID namespace)")
PY
    return "$rc"
}

# The control plane at real speed (issue 19): one card, real fp16/bf16 replicas of all
# three stages, "auto" batches (about 1 MiB of text each), one-sentence and news-like
# documents, no embeddings written: sentences/s per card, the replicas' busy share of the
# processing time (manifest), and the driver's CPU seconds (its own process).
step_control() {
    local py="$VENV/bin/python"
    printf '[resources.%s]\ngpu_replicas = 1\n' sentencize embed classify > "$WORK/control.toml"
    "$py" - "$WORK" << 'PY' | tee "$WORK/control.md"
import json, os, subprocess, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
work = sys.argv[1]
words = ("Revenue rose {} percent in the quarter on strong demand in Europe.",
         "The company cut its guidance after a weak season at unit {}.",
         "Analysts expect margins to narrow as costs climb {} points.")
print("| corpus | docs | sentences | processing s | sentences/s | busy embed | busy classify | docintel CLI + reaped children CPU s |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for kind, n, per in (("one-sentence", 200_000, 1), ("news-like", 20_000, 17)):
    rng = np.random.default_rng(0)
    texts = [" ".join(words[j].format(i % 997) for j in rng.integers(0, 3, per)) for i in range(n)]
    path = f"{work}/control-{kind}.parquet"
    pq.write_table(pa.table({"doc_id": [f"d{i}" for i in range(n)], "text": texts}), path,
                   row_group_size=50_000)
    out = f"{work}/control-{kind}-out"
    t0 = os.times()
    subprocess.run([f"{os.environ['VENV']}/bin/docintel", "run", path, out, "--gpus", "1",
                    "--spill", "gpu-only", "--no-embeddings", "--no-progress",
                    "--config", f"{work}/control.toml"], check=True)
    t1 = os.times()
    m = json.load(open(f"{out}/_manifest.json"))
    proc = m["timings"]["processing_seconds"]
    busy = {r["stage"]: r["busy_seconds"] / proc for r in m["replicas"] if r["pool"] == "gpu"}
    sents = m["counts"]["sentences"]
    print(f"| {kind} | {n:,} | {sents:,} | {proc:.1f} | {sents / proc:,.0f} | "
          f"{busy.get('embed', 0):.0%} | {busy.get('classify', 0):.0%} | "
          f"{t1.children_user + t1.children_system - t0.children_user - t0.children_system:.1f} |")
PY
}

step_spill() {
    local last=$(($(nproc) - 1))
    "$VENV/bin/python" bench/spill.py --gpu-cores 0-3 --cpu-cores "4-$last" --gpu-delay 0 \
        --batch 32 --repeat 4 --rounds 1 --calm-docs 128 > "$WORK/spill.md"
    cat "$WORK/spill.md"
}

export -f log step_env step_install step_gpu_tests step_quantize step_stages step_one_card \
    step_control step_spill

failed=0
run_step env 30 step_env || failed=1
if ! run_step install 300 step_install; then
    failed=1
    log "install failed: the other steps need it, stopping (see $RESULTS/install.log)"
else
    run_step quantize 180 step_quantize &
    quantize_pid=$!
    run_step gpu-tests 200 step_gpu_tests || failed=1
    wait "$quantize_pid" || failed=1
    run_step stages 150 step_stages || failed=1
    run_step one-card 100 step_one_card || failed=1
    run_step control 120 step_control || failed=1
    run_step spill 240 step_spill || failed=1
fi

{
    echo "# docintel GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- revision: $(git -C "$REPO" rev-parse --short HEAD 2> /dev/null || echo unknown)"
    echo "- card: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null || echo none)"
    echo "- cores: $(nproc); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- total: ${SECONDS} s (deadline ${DEADLINE_S} s)"
    echo
    echo "| step | status | time |"
    echo "| --- | --- | ---: |"
    cat "$STATUS"
    for part in stages one-card spill; do
        if [[ -s $WORK/$part.md ]]; then
            echo
            echo "## $part"
            echo
            cat "$WORK/$part.md"
        fi
    done
} > "$SUMMARY"
cat "$SUMMARY"
rm -rf "$WORK"
exit "$failed"
