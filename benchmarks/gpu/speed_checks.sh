#!/usr/bin/env bash
# The speed issue's GPU checks on a lent GPU machine (H100 or H200), writing every row under $OUT
# (default runs/gpu-checks). Run from the repository root; needs no network. Ten parts, each
# within one 10-minute device call (every step has its own time limit, so a slow one leaves time
# for the rest, and finished rows are kept):
#   bash benchmarks/gpu/speed_checks.sh generate   # GPU tests; bench_generate at the LLaDA-8B shape,
#                                                   # bf16: every cache policy against none at batch
#                                                   # 1 and 8, with and without CUDA graphs, and
#                                                   # compiled with graphs at batch 1
#   bash benchmarks/gpu/speed_checks.sh peers      # bench_peers against Fast-dLLM's own loops; needs a
#                                                   # checkout at $FASTDLLM and a peer interpreter at
#                                                   # $PEER_PYTHON (transformers 4.x; benchmarks/peers/);
#                                                   # LLaDA's generate.py too with $LLADA (a checkout)
#   bash benchmarks/gpu/speed_checks.sh step       # one call: the fused head's tests and timings,
#                                                   # single forwards at the LLaDA-8B shape with op
#                                                   # counts, a profile and torch.compile, and graphed
#                                                   # decodes against the sum of their forwards
#   bash benchmarks/gpu/speed_checks.sh moe        # LLaDA-MoE-7B-A1B and LLaDA2.0-mini shapes: forwards
#                                                   # with the MoE share, compiled, and cache policies
#   bash benchmarks/gpu/speed_checks.sh short      # one call for a short lease: the kernel and graph
#                                                   # tests, the fused head scoring, single forwards
#                                                   # (full vs cached step) and bench_peers at the
#                                                   # LLaDA-8B shape, dllm eager and graphed; needs
#                                                   # $FASTDLLM and $PEER_PYTHON as `peers`
#   bash benchmarks/gpu/speed_checks.sh serve      # bench_serve with the shipped model on the GPU,
#                                                   # float32, concurrency 1, 8, 32, without a cache
#                                                   # and with dual (the serving issue's GPU rows)
#   bash benchmarks/gpu/speed_checks.sh rope       # the fused rotary + K/V write: its tests (bf16
#                                                   # too), single forwards and graphed none/dual
#                                                   # decodes at the LLaDA-8B shape with
#                                                   # DLLM_ROPE_WRITE=torch and =triton
#   bash benchmarks/gpu/speed_checks.sh attention  # the attention kernel: its tests (bf16 too), then
#                                                   # sdpa, fixed and tuned launches at 32 queries x
#                                                   # 512-4096 keys (LLaDA-8B and Dream-7B heads),
#                                                   # then graphed none/dual decodes at the LLaDA-8B
#                                                   # shape with sdpa and with tuned Triton launches
#   bash benchmarks/gpu/speed_checks.sh loop       # one call for a short lease: the attention kernel's
#                                                   # tests, graphed LLaDA-8B-shape decodes against the
#                                                   # sum of their forwards with the loop's counts,
#                                                   # sdpa against fixed and tuned attention launches,
#                                                   # and single forwards with DLLM_ROPE_WRITE=torch/triton
#   bash benchmarks/gpu/speed_checks.sh gaps       # graphed LLaDA-8B-shape decodes profiled: per step the
#                                                   # wall time, the forwards' time and the device's busy
#                                                   # time, with each decode's operator table
set -u
PART=${1:-generate}
OUT=${OUT:-runs/gpu-checks}
mkdir -p "$OUT"
# The machine, the versions and the install's messages go to one file: a device call returns at most 8.
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    python -m pip install -q --no-deps --no-build-isolation -e .
} >"$OUT/machine.txt" 2>&1

need_peer() {
    if [ -z "${FASTDLLM:-}" ] || [ -z "${PEER_PYTHON:-}" ]; then
        echo "set FASTDLLM (a Fast-dLLM checkout) and PEER_PYTHON (the peer interpreter)" >&2
        exit 2
    fi
}

case "$PART" in
short)
    need_peer
    timeout 75 python -m pytest -q -m "gpu or not slow" tests/test_graphs.py tests/test_kernels_head_scoring.py \
        >"$OUT/pytest-gpu.log" 2>&1
    timeout 60 python benchmarks/bench_kernels.py --only head_scoring --positions 32,256 \
        --out "$OUT/head-scoring.jsonl" >"$OUT/head-scoring.log" 2>&1
    timeout 80 python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10 \
        >"$OUT/forward.log" 2>&1
    timeout 320 python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" --peer-python "$PEER_PYTHON" \
        --preset llada-8b --dtype bfloat16 --device cuda --configs dual,threshold --variants eager,graphs \
        --warmup-runs 1 --repeats 1 --workdir /tmp/bp --out "$OUT/peers.jsonl" >"$OUT/peers.log" 2>&1
    ;;
step)
    # where a cached step's time goes, the fused head after its fixes, and compiled single forwards
    timeout 60 python -m pytest -q -m "gpu or not slow" tests/test_kernels_head_scoring.py >"$OUT/pytest-gpu.log" 2>&1
    timeout 40 python benchmarks/bench_kernels.py --only head_scoring --positions 32,256 \
        --out "$OUT/head-scoring.jsonl" >"$OUT/head-scoring.log" 2>&1
    timeout 80 python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10 --count --profile \
        >"$OUT/forward.log" 2>&1
    timeout 170 python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10 --compile \
        >"$OUT/forward-compile.log" 2>&1
    # the whole decode against the sum of its forwards (CUDA events), graphed, and the loop's counts
    timeout 150 python benchmarks/bench_overhead.py --presets llada-8b --device cuda --dtype bfloat16 \
        --prompt-length 256 --gen-length 256 --block-length 32 --grid threshold+dual,threshold+none --time 2 \
        --cuda-graphs --out "$OUT/overhead-8b.jsonl" >"$OUT/overhead-8b.log" 2>&1
    ;;
moe)
    # LLaDA-MoE-7B-A1B and LLaDA2.0-mini shapes, bf16: single forwards with the MoE share (eager,
    # graphed, compiled), then the cache policies (exact on LLaDA2's block-causal attention)
    timeout 60 python -m pytest -q -m "gpu or not slow" tests/test_llada_moe.py tests/test_llada2.py \
        >"$OUT/pytest-moe.log" 2>&1
    timeout 150 python benchmarks/bench_forward.py --presets llada-moe-7b,llada2-mini --device cuda --calls 10 --count \
        >"$OUT/forward-moe.log" 2>&1
    timeout 120 python benchmarks/bench_forward.py --presets llada-moe-7b,llada2-mini --device cuda --calls 10 \
        --compile >"$OUT/forward-moe-compile.log" 2>&1
    timeout 200 python benchmarks/bench_generate.py --caches --presets llada-moe-7b,llada2-mini --policies none,dual \
        --no-headline --cuda-graphs --out "$OUT/caches-moe.jsonl" >"$OUT/caches-moe.log" 2>&1
    ;;
generate)
    timeout 90 python -m pytest -q -m gpu tests >"$OUT/pytest-gpu.log" 2>&1
    for graphs in "" "--cuda-graphs"; do
        timeout 150 python benchmarks/bench_generate.py --presets llada-8b --device cuda --dtype bfloat16 \
            --batch 1,8 --caches --policies none,dual,prefix --repeats 1 $graphs \
            --out "$OUT/generate${graphs:+-graphs}.jsonl" >"$OUT/generate${graphs:+-graphs}.log" 2>&1
    done
    timeout 150 python benchmarks/bench_generate.py --presets llada-8b --device cuda --dtype bfloat16 --batch 1 \
        --caches --policies none,dual --repeats 1 --cuda-graphs --compile \
        --out "$OUT/generate-graphs-compile.jsonl" >"$OUT/generate-graphs-compile.log" 2>&1
    ;;
peers)
    need_peer
    # with LLADA set (an ML-GSAI/LLaDA checkout), LLaDA's own generate.py as well
    timeout 500 python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" --peer-python "$PEER_PYTHON" \
        ${LLADA:+--llada "$LLADA"} --preset llada-8b --dtype bfloat16 --device cuda \
        --configs dual,threshold${LLADA:+,llada} --warmup-runs 1 \
        --repeats 1 --workdir /tmp/bp --out "$OUT/peers.jsonl" >"$OUT/peers.log" 2>&1
    ;;
rope)
    timeout 90 python -m pytest -q -m "gpu or not slow" tests/test_kernels_rope_write.py >"$OUT/pytest-rope.log" 2>&1
    for impl in torch triton; do
        DLLM_ROPE_WRITE=$impl timeout 100 python benchmarks/bench_forward.py --presets llada-8b --device cuda \
            --calls 10 --count >"$OUT/forward-rope-$impl.log" 2>&1
    done
    for impl in torch triton; do   # whole decodes with CUDA graphs: dual against none
        DLLM_ROPE_WRITE=$impl timeout 140 python benchmarks/bench_generate.py --presets llada-8b --device cuda \
            --dtype bfloat16 --batch 1 --caches --policies none,dual --repeats 1 --no-headline --cuda-graphs \
            --out "$OUT/generate-rope-$impl.jsonl" >"$OUT/generate-rope-$impl.log" 2>&1
    done
    ;;
attention)
    timeout 120 python -m pytest -q -m "gpu or not slow" tests/test_kernels_attention.py >"$OUT/pytest-attention.log" 2>&1
    timeout 150 python benchmarks/bench_kernels.py --only attention --configs --out "$OUT/attention.jsonl" \
        >"$OUT/attention.log" 2>&1
    for backend in sdpa triton; do   # whole decodes with CUDA graphs; the Triton one with tuned launches
        DLLM_ATTENTION_LAUNCH=tuned timeout 140 python benchmarks/bench_generate.py --presets llada-8b \
            --device cuda --dtype bfloat16 --batch 1 --caches --policies none,dual --repeats 1 --no-headline \
            --cuda-graphs --attention $backend --out "$OUT/generate-attention-$backend.jsonl" \
            >"$OUT/generate-attention-$backend.log" 2>&1
    done
    ;;
loop)
    timeout 100 python -m pytest -q -m "gpu or not slow" tests/test_kernels_attention.py >"$OUT/pytest-attention.log" 2>&1
    timeout 160 python benchmarks/bench_overhead.py --presets llada-8b --device cuda --dtype bfloat16 \
        --prompt-length 256 --gen-length 256 --block-length 32 --grid threshold+dual,threshold+none --time 2 \
        --cuda-graphs --out "$OUT/overhead-8b.jsonl" >"$OUT/overhead-8b.log" 2>&1
    timeout 120 python benchmarks/bench_kernels.py --only attention --out "$OUT/attention.jsonl" \
        >"$OUT/attention.log" 2>&1
    for impl in torch triton; do
        DLLM_ROPE_WRITE=$impl timeout 70 python benchmarks/bench_forward.py --presets llada-8b --device cuda \
            --calls 10 --count >"$OUT/forward-rope-$impl.log" 2>&1
    done
    ;;
gaps)
    timeout 300 python benchmarks/bench_overhead.py --presets llada-8b --device cuda --dtype bfloat16 \
        --prompt-length 256 --gen-length 256 --block-length 32 --grid threshold+dual,threshold+none --time 1 \
        --cuda-graphs --profile "$OUT/profile" --out "$OUT/gaps-8b.jsonl" >"$OUT/gaps-8b.log" 2>&1
    ;;
serve)
    timeout 270 python benchmarks/bench_serve.py --device cuda --requests 256 --concurrency 1,8,32 --gen-length 64 \
        --out "$OUT/serve-none.jsonl" >"$OUT/serve-none.log" 2>&1
    timeout 270 python benchmarks/bench_serve.py --device cuda --requests 256 --concurrency 1,8,32 --gen-length 64 \
        --cache dual --block-length 32 --out "$OUT/serve-dual.jsonl" >"$OUT/serve-dual.log" 2>&1
    ;;
*)
    echo "unknown part $PART: give moe, step, short, generate, peers, serve, rope, attention, loop or gaps" >&2
    exit 2
    ;;
esac
tail -n 3 "$OUT"/*.log
