#!/usr/bin/env bash
# Downloads into .peers/ (git-ignored) what `speed_checks.sh peers`, `dream` and `short` need to run
# Fast-dLLM's own LLaDA and Dream loops on the GPU machine, which cannot download: Fast-dLLM's
# `llada/` and `dream/` code at the commit the peers results name, and the wheels of transformers 4.x
# and of the packages its remote code needs in versions the machine's image lacks (Python 3.12,
# x86-64 Linux). Run here (with network) from the repository root, then name .peers in the device
# call's carry: speed_checks.sh then installs the wheels apart from dllm's packages and sets FASTDLLM
# and PEER_PYTHON itself.
#   FASTDLLM_GIT_DIR=/path/to/Fast-dLLM/.git bash benchmarks/gpu/fetch_peers.sh   # from a local clone
#   bash benchmarks/gpu/fetch_peers.sh                                            # clones from GitHub
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMIT=${FASTDLLM_COMMIT:-24cc59e75f20a6384bae8c905965bb090b96388e}
mkdir -p .peers/wheels .peers/fast-dllm
if [ ! -f .peers/fast-dllm/llada/generate.py ] || [ ! -f .peers/fast-dllm/dream/model/generation_utils_block.py ]; then
    git_dir=${FASTDLLM_GIT_DIR:-}
    if [ -z "$git_dir" ]; then
        tmp=$(mktemp -d)
        git clone -q --bare https://github.com/NVlabs/Fast-dLLM "$tmp/repo.git"
        git_dir=$tmp/repo.git
    fi
    git --git-dir="$git_dir" archive "$COMMIT" llada dream | tar -x -C .peers/fast-dllm
    echo "$COMMIT" >.peers/fast-dllm/COMMIT
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .peers/wheels transformers==4.57.6 tokenizers==0.22.2 huggingface-hub==0.36.2 einops==0.8.2 accelerate==1.15.0
ls .peers/fast-dllm/llada .peers/fast-dllm/dream/model .peers/wheels
du -sh .peers
