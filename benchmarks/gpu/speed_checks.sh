#!/usr/bin/env bash
# The speed issue's GPU checks in one run on a lent GPU machine (H100 or H200), writing every row
# under $OUT (default runs/gpu-checks). Runs from the repository root; needs no network:
#   - the GPU tests (`pytest -m gpu`);
#   - bench_overhead counts (device-independent, as a cross-check of the CPU ones);
#   - bench_generate at the LLaDA-8B shape, bf16: batch 1, 8 and 32, every cache policy against
#     none, with and without CUDA graphs, and batch 1 compiled with graphs (tokens/s, forwards,
#     the same-token check, compile time);
#   - bench_peers against Fast-dLLM's own loops, when a checkout is at $FASTDLLM and a peer
#     interpreter at $PEER_PYTHON (transformers 4.x on its path; see benchmarks/peers/).
# Each part has its own time limit so one slow part leaves time for the others.
set -u
OUT=${OUT:-runs/gpu-checks}
mkdir -p "$OUT"
python -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.csv" 2>&1
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >"$OUT/versions.txt"

timeout 120 python -m pytest -q -m gpu tests >"$OUT/pytest-gpu.log" 2>&1
timeout 60 python benchmarks/bench_overhead.py --out "$OUT/overhead.jsonl" >"$OUT/overhead.log" 2>&1
for graphs in "" "--cuda-graphs"; do
    timeout 150 python benchmarks/bench_generate.py --presets llada-8b --device cuda --dtype bfloat16 \
        --batch 1,8,32 --caches --policies none,dual,prefix --repeats 1 $graphs \
        --out "$OUT/generate${graphs:+-graphs}.jsonl" >"$OUT/generate${graphs:+-graphs}.log" 2>&1
done
timeout 200 python benchmarks/bench_generate.py --presets llada-8b --device cuda --dtype bfloat16 --batch 1 \
    --caches --policies none,dual --repeats 1 --cuda-graphs --compile \
    --out "$OUT/generate-graphs-compile.jsonl" >"$OUT/generate-graphs-compile.log" 2>&1
if [ -n "${FASTDLLM:-}" ] && [ -n "${PEER_PYTHON:-}" ]; then
    timeout 240 python benchmarks/bench_peers.py --fastdllm "$FASTDLLM" --peer-python "$PEER_PYTHON" \
        --preset llada-8b --dtype bfloat16 --device cuda --configs dual,threshold --warmup-runs 1 \
        --repeats 1 --workdir /tmp/bp --out "$OUT/peers.jsonl" >"$OUT/peers.log" 2>&1
fi
tail -n 3 "$OUT"/*.log
