"""d2Cache's own `certainty_density` against the density dllm's `certainty_prior` weights confidences
with, and the picks the two make (no timing).

d2Cache's function (`src/utils/common.py`, float32 FFT convolution) is loaded from the checkout given
with `--d2cache DIR` (that file needs torch only, so it runs in this environment; d2Cache's decoding
loop needs its whole package and is not run). For random decoded masks of generation regions of 1 to
`--max-length` columns, at sigma 0.5 to 30, it prints the largest absolute difference of the two
densities, and how often the mask each picks first (confidence x density, random confidences,
ties to the lower column) differs.

    python benchmarks/peers/d2cache_density_parity.py --d2cache D2CACHE [--cases 400] [--seed 0] [--max-length 512]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def load_density(root: Path):
    path = root / "src" / "utils" / "common.py"
    if not path.is_file():
        raise SystemExit(f"--d2cache {root}: no src/utils/common.py there; give a checkout of "
                         f"https://github.com/Kamichanw/d2Cache")
    spec = importlib.util.spec_from_file_location("d2cache_common", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.certainty_density


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d2cache", type=Path, required=True, help="d2Cache checkout (holds src/utils/common.py)")
    p.add_argument("--cases", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-length", type=int, default=512)
    args = p.parse_args(argv)
    import torch
    from dllm.samplers.certainty_prior import certainty_density, density_kernel

    theirs = load_density(args.d2cache.resolve())
    gen = torch.Generator().manual_seed(args.seed)
    worst, picks_differ, masks_seen = 0.0, 0, 0
    for _ in range(args.cases):
        G = int(torch.randint(1, args.max_length + 1, (1,), generator=gen))
        sigma = float(torch.empty(1).uniform_(0.5, 30.0, generator=gen))
        decoded = torch.rand(4, G, generator=gen) < torch.rand(4, 1, generator=gen)
        decoded[:, 0] |= torch.rand(4, generator=gen) < 0.5            # a prefix decoded, sometimes
        ours = certainty_density(decoded, *density_kernel(G, sigma, "cpu"))
        peer = theirs(decoded, sigma=sigma).double()
        worst = max(worst, float((ours - peer).abs().max()))
        conf = torch.rand(4, G, generator=gen, dtype=torch.float64)
        for row in range(4):
            masked = ~decoded[row]
            if not masked.any():
                continue
            masks_seen += 1
            pick = [int(torch.where(masked, conf[row] * d[row], -torch.inf).argmax()) for d in (ours, peer)]
            picks_differ += pick[0] != pick[1]
    print(f"{args.cases} cases (4 rows each, lengths 1-{args.max_length}, sigma 0.5-30): largest |dllm - d2Cache| "
          f"density {worst:.3g}; first picks differing in {picks_differ} of {masks_seen} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
