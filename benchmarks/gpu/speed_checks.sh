#!/usr/bin/env bash
# The speed issue's GPU checks on a lent GPU machine (H100 or H200), writing every row under $OUT
# (default runs/gpu-checks). Run from the repository root; needs no network. Fourteen parts, each
# within one 10-minute device call (every step has its own time limit, so a slow one leaves time
# for the rest; rows are written as they are made, so a stopped step keeps its finished rows, except
# bench_peers, which writes its rows once the peer has run every configuration;
# each step's exit status is printed and kept in machine.txt, 124 for a step stopped at its limit).
# Python packages the machine lacks travel as wheels in .whl/ (carry it): `serve` needs the
# server's stack and the OpenAI client, which benchmarks/gpu/fetch_wheels.sh downloads; `peers` and
# `short` need Fast-dLLM and transformers 4.x, which benchmarks/gpu/fetch_peers.sh puts in .peers/.
#   bash benchmarks/gpu/speed_checks.sh generate   # GPU tests; bench_generate at the LLaDA-8B shape,
#                                                   # bf16: dual and prefix against none at batch
#                                                   # 1 and 8, with and without CUDA graphs, and
#                                                   # compiled with graphs at batch 1
#   bash benchmarks/gpu/speed_checks.sh peers      # bench_peers against Fast-dLLM's own loops; needs a
#                                                   # checkout at $FASTDLLM and a peer interpreter at
#                                                   # $PEER_PYTHON (transformers 4.x; benchmarks/peers/);
#                                                   # LLaDA's generate.py too with $LLADA (a checkout)
#   bash benchmarks/gpu/speed_checks.sh dream      # bench_peers at the Dream-7B shape, bf16, against
#                                                   # Fast-dLLM's own Dream loops (no cache, use_cache,
#                                                   # dual_cache), dllm eager and graphed ($FASTDLLM and
#                                                   # $PEER_PYTHON as `peers`)
#   bash benchmarks/gpu/speed_checks.sh dream-entropy  # the same against the entropy loops of
#                                                   # Fast-dLLM's Dream scripts (no cache, use_cache,
#                                                   # dual_cache; gen_length steps)
#   bash benchmarks/gpu/speed_checks.sh step       # one call: the fused head's tests and timings,
#                                                   # single forwards at the LLaDA-8B shape with op
#                                                   # counts, a profile and torch.compile, and graphed
#                                                   # decodes against the sum of their forwards
#   bash benchmarks/gpu/speed_checks.sh moe        # LLaDA-MoE-7B-A1B and LLaDA2.0-mini shapes: forwards
#                                                   # with the MoE share, compiled, and cache policies
#   bash benchmarks/gpu/speed_checks.sh short      # one call for a short lease: the kernel and graph
#                                                   # tests, the fused head scoring, single forwards
#                                                   # (full vs cached step) and bench_peers at the
#                                                   # LLaDA-8B shape, dllm eager and graphed (with
#                                                   # $FASTDLLM and $PEER_PYTHON as `peers`; else
#                                                   # that step is left out)
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
#   bash benchmarks/gpu/speed_checks.sh freedave   # the freedave grids of the default sweep on the GPU
#                                                   # (shipped model, float32, eager and graphed, no
#                                                   # cache and dual): low_confidence one token per
#                                                   # step against freedave's drafts 2, 4, 8
#   bash benchmarks/gpu/speed_checks.sh gaps       # graphed LLaDA-8B-shape decodes profiled: per step the
#                                                   # wall time, the forwards' time and the device's busy
#                                                   # time, with each decode's operator table
#   bash benchmarks/gpu/speed_checks.sh dpad       # bench_dpad at the LLaDA-8B shape, bf16, prompt 256, gen
#                                                   # 1024, block 32: suffix dropout against the same decode
#                                                   # without it, no cache, prefix and dual
set -u
export PYTHONUNBUFFERED=1
PART=${1:-generate}
OUT=${OUT:-runs/gpu-checks}
mkdir -p "$OUT"
# The machine, the versions, the install's messages and each step's status go to one file: a
# device call returns at most 8.
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    if ls .whl/*.whl >/dev/null 2>&1; then
        timeout 120 python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --disable-pip-version-check --target /tmp/site .whl/*.whl && echo "carried wheels: $(ls .whl | tr '\n' ' ')"
    fi
    python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    timeout 120 python -m pip install -q --no-deps --no-build-isolation --no-index --disable-pip-version-check -e .
} >"$OUT/machine.txt" 2>&1
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; fi

# step NAME SECONDS LOG COMMAND...: run COMMAND with a time limit (SIGINT first, so Python ends
# cleanly), its output in $OUT/LOG, and report its exit status.
step() {
    local name=$1 seconds=$2 log=$3
    shift 3
    timeout -s INT -k 15 "$seconds" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    echo "step $name rc=$rc" | tee -a "$OUT/machine.txt"
}

# Without FASTDLLM and PEER_PYTHON, a carried .peers/ (benchmarks/gpu/fetch_peers.sh) gives them:
# its wheels (transformers 4.x, ...) go to a folder of their own, which only the peer's interpreter
# reads before the image's packages.
peer_from_carry() {
    if [ -n "${FASTDLLM:-}" ] || [ ! -f .peers/fast-dllm/llada/generate.py ]; then
        return
    fi
    timeout 120 python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target /tmp/peer-site .peers/wheels/*.whl >>"$OUT/machine.txt" 2>&1
    printf '#!/bin/sh\nPYTHONPATH=/tmp/peer-site exec %s "$@"\n' "$(command -v python)" >/tmp/peer-python
    chmod +x /tmp/peer-python
    export FASTDLLM=$PWD/.peers/fast-dllm PEER_PYTHON=/tmp/peer-python
    echo "peer from .peers: Fast-dLLM $(cat .peers/fast-dllm/COMMIT), $(ls .peers/wheels | tr '\n' ' ')" >>"$OUT/machine.txt"
}

have_peer() {
    peer_from_carry
    [ -n "${FASTDLLM:-}" ] && [ -n "${PEER_PYTHON:-}" ]
}

need_peer() {
    if ! have_peer; then
        echo "set FASTDLLM (a Fast-dLLM checkout) and PEER_PYTHON (the peer interpreter), or carry .peers" >&2
        exit 2
    fi
}

GPU_TESTS="tests/test_graphs.py tests/test_kernels_head_scoring.py"   # the files holding `gpu` tests

case "$PART" in
short)
    step tests 75 pytest-gpu.log python -m pytest -q -m "gpu or not slow" $GPU_TESTS
    step head-scoring 60 head-scoring.log python benchmarks/bench_kernels.py --only head_scoring --positions 32,256 \
        --out "$OUT/head-scoring.jsonl"
    step forward 80 forward.log python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10
    if have_peer; then
        step peers 320 peers.log python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" --peer-python "$PEER_PYTHON" \
            --preset llada-8b --dtype bfloat16 --device cuda --configs dual,threshold --variants eager,graphs \
            --warmup-runs 1 --repeats 1 --workdir /tmp/bp --out "$OUT/peers.jsonl"
    else
        echo "step peers skipped: FASTDLLM and PEER_PYTHON are not set" | tee -a "$OUT/machine.txt"
    fi
    ;;
step)
    # where a cached step's time goes, the fused head after its fixes, and compiled single forwards
    step tests 60 pytest-gpu.log python -m pytest -q -m "gpu or not slow" tests/test_kernels_head_scoring.py
    step head-scoring 40 head-scoring.log python benchmarks/bench_kernels.py --only head_scoring --positions 32,256 \
        --out "$OUT/head-scoring.jsonl"
    step forward 80 forward.log python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10 \
        --count --profile
    step forward-compile 170 forward-compile.log python benchmarks/bench_forward.py --presets llada-8b --device cuda \
        --calls 10 --compile
    # the whole decode against the sum of its forwards (CUDA events), graphed, and the loop's counts
    step overhead 150 overhead-8b.log python benchmarks/bench_overhead.py --presets llada-8b --device cuda \
        --dtype bfloat16 --prompt-length 256 --gen-length 256 --block-length 32 \
        --grid threshold+dual,threshold+none --time 2 --cuda-graphs --out "$OUT/overhead-8b.jsonl"
    ;;
moe)
    # LLaDA-MoE-7B-A1B and LLaDA2.0-mini shapes, bf16: single forwards with the MoE share (eager,
    # graphed, compiled), then the cache policies (exact on LLaDA2's block-causal attention)
    step forward-moe 150 forward-moe.log python benchmarks/bench_forward.py --presets llada-moe-7b,llada2-mini \
        --device cuda --calls 10 --count
    step forward-moe-compile 120 forward-moe-compile.log python benchmarks/bench_forward.py \
        --presets llada-moe-7b,llada2-mini --device cuda --calls 10 --compile
    step caches-moe 200 caches-moe.log python benchmarks/bench_generate.py --caches --presets llada-moe-7b,llada2-mini \
        --policies none,dual --repeats 1 --no-headline --cuda-graphs --out "$OUT/caches-moe.jsonl"
    ;;
dpad)
    step dpad 500 dpad.log python benchmarks/bench_dpad.py --presets llada-8b --device cuda --dtype bfloat16 \
        --prompt-length 256 --gen-length 1024 --block-length 32 --tokens-per-step 4 --repeats 1 --out "$OUT/dpad.jsonl"
    ;;
freedave)
    for grid in freedave freedave-dual; do
        for graphs in "" "--cuda-graphs"; do
            step "sweep-$grid${graphs:+-graphs}" 140 "sweep-$grid${graphs:+-graphs}.log" dllm sweep \
                --grid "benchmarks/results/sweep-default/$grid/grid.yaml" --device cuda $graphs \
                --out-dir "$OUT/sweep-$grid${graphs:+-graphs}"
        done
    done
    ;;
generate)
    step tests 90 pytest-gpu.log python -m pytest -q -m gpu $GPU_TESTS
    for graphs in "" "--cuda-graphs"; do
        step "generate${graphs:+-graphs}" 150 "generate${graphs:+-graphs}.log" python benchmarks/bench_generate.py \
            --presets llada-8b --device cuda --dtype bfloat16 --batch 1,8 --caches --policies none,dual,prefix \
            --repeats 1 --no-headline $graphs --out "$OUT/generate${graphs:+-graphs}.jsonl"
    done
    step generate-graphs-compile 150 generate-graphs-compile.log python benchmarks/bench_generate.py \
        --presets llada-8b --device cuda --dtype bfloat16 --batch 1 --caches --policies none,dual --repeats 1 \
        --no-headline --cuda-graphs --compile --out "$OUT/generate-graphs-compile.jsonl"
    ;;
peers)
    need_peer
    # with LLADA set (an ML-GSAI/LLaDA checkout), LLaDA's own generate.py as well
    step peers 500 peers.log python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" --peer-python "$PEER_PYTHON" \
        ${LLADA:+--llada "$LLADA"} --preset llada-8b --dtype bfloat16 --device cuda \
        --configs dual,threshold${LLADA:+,llada} --warmup-runs 1 --repeats 1 --workdir /tmp/bp --out "$OUT/peers.jsonl"
    ;;
dream)
    need_peer
    step peers-dream 540 peers-dream.log python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" \
        --peer-python "$PEER_PYTHON" --preset dream-7b --dtype bfloat16 --device cuda --configs dual,prefix,threshold \
        --variants eager,graphs --warmup-runs 1 --repeats 1 --workdir /tmp/bp --out "$OUT/peers-dream.jsonl"
    ;;
dream-entropy)
    need_peer
    step peers-dream-entropy 540 peers-dream-entropy.log python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" \
        --peer-python "$PEER_PYTHON" --preset dream-7b --dtype bfloat16 --device cuda \
        --configs entropy_prefix,entropy_dual,entropy --variants eager,graphs --warmup-runs 1 --repeats 1 \
        --workdir /tmp/bp --out "$OUT/peers-dream-entropy.jsonl"
    ;;
rope)
    step tests 90 pytest-rope.log python -m pytest -q -m "gpu or not slow" tests/test_kernels_rope_write.py
    for impl in torch triton; do
        step "forward-rope-$impl" 100 "forward-rope-$impl.log" env DLLM_ROPE_WRITE=$impl \
            python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10 --count
    done
    for impl in torch triton; do   # whole decodes with CUDA graphs: dual against none
        step "generate-rope-$impl" 140 "generate-rope-$impl.log" env DLLM_ROPE_WRITE=$impl \
            python benchmarks/bench_generate.py --presets llada-8b --device cuda --dtype bfloat16 --batch 1 --caches \
            --policies none,dual --repeats 1 --no-headline --cuda-graphs --out "$OUT/generate-rope-$impl.jsonl"
    done
    ;;
attention)
    step tests 120 pytest-attention.log python -m pytest -q -m "gpu or not slow" tests/test_kernels_attention.py
    step attention 150 attention.log python benchmarks/bench_kernels.py --only attention --configs \
        --out "$OUT/attention.jsonl"
    for backend in sdpa triton; do   # whole decodes with CUDA graphs; the Triton one with tuned launches
        step "generate-attention-$backend" 140 "generate-attention-$backend.log" env DLLM_ATTENTION_LAUNCH=tuned \
            python benchmarks/bench_generate.py --presets llada-8b --device cuda --dtype bfloat16 --batch 1 --caches \
            --policies none,dual --repeats 1 --no-headline --cuda-graphs --attention $backend \
            --out "$OUT/generate-attention-$backend.jsonl"
    done
    ;;
loop)
    step tests 100 pytest-attention.log python -m pytest -q -m "gpu or not slow" tests/test_kernels_attention.py
    step overhead 160 overhead-8b.log python benchmarks/bench_overhead.py --presets llada-8b --device cuda \
        --dtype bfloat16 --prompt-length 256 --gen-length 256 --block-length 32 \
        --grid threshold+dual,threshold+none --time 2 --cuda-graphs --out "$OUT/overhead-8b.jsonl"
    step attention 120 attention.log python benchmarks/bench_kernels.py --only attention --out "$OUT/attention.jsonl"
    for impl in torch triton; do
        step "forward-rope-$impl" 70 "forward-rope-$impl.log" env DLLM_ROPE_WRITE=$impl \
            python benchmarks/bench_forward.py --presets llada-8b --device cuda --calls 10 --count
    done
    ;;
gaps)
    step gaps 300 gaps-8b.log python benchmarks/bench_overhead.py --presets llada-8b --device cuda --dtype bfloat16 \
        --prompt-length 256 --gen-length 256 --block-length 32 --grid threshold+dual,threshold+none --time 1 \
        --cuda-graphs --profile "$OUT/profile" --out "$OUT/gaps-8b.jsonl"
    ;;
serve)
    if ! python -c "import fastapi, uvicorn, openai" 2>>"$OUT/machine.txt"; then
        echo "serve needs fastapi, uvicorn and openai: run benchmarks/gpu/fetch_wheels.sh here and carry .whl" \
            | tee -a "$OUT/machine.txt"
        exit 3
    fi
    step serve-none 270 serve-none.log python benchmarks/bench_serve.py --device cuda --requests 256 \
        --concurrency 1,8,32 --gen-length 64 --out "$OUT/serve-none.jsonl"
    step serve-dual 270 serve-dual.log python benchmarks/bench_serve.py --device cuda --requests 256 \
        --concurrency 1,8,32 --gen-length 64 --cache dual --block-length 32 --out "$OUT/serve-dual.jsonl"
    ;;
*)
    echo "unknown part $PART: give moe, step, short, generate, peers, dream, dream-entropy, serve, rope, attention," \
        "loop, gaps, freedave or dpad" >&2
    exit 2
    ;;
esac
tail -n 3 "$OUT"/*.log
