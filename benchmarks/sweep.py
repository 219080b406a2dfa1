"""The speed/quality sweep over models x samplers x caches x lengths on ParallelBench.

    python benchmarks/sweep.py --grid benchmarks/grids/default.yaml --out-dir runs/sweep
    torchrun --nproc_per_node 2 benchmarks/sweep.py --grid benchmarks/grids/default.yaml --out-dir runs/sweep

The same as `dllm sweep` (the logic lives in `dllm.sweep`, installed with the package); see
`dllm sweep --help` and the package doc of `dllm/sweep/__init__.py` for the grid format and the outputs.
"""
from __future__ import annotations

import sys

from dllm.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
