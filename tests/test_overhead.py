"""`dllm.overhead`: what the counter calls a host-device synchronisation, and the counts of a
decode per step type (deterministic, so asserted here; `benchmarks/bench_overhead.py` prints them)."""
import json

import pytest
import torch

import dllm
from dllm.config import GenerationConfig, ModelConfig
from dllm.overhead import DispatchCounter, count_decode

PROMPTS = [[5, 6, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def tiny():
    return dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)


def _syncs(fn) -> int:
    counter = DispatchCounter()
    with counter:
        fn()
    return counter.counts["loop"].syncs


def test_a_kernel_launch_counts_as_one_operation():
    """What runs inside `dllm.kernels.launching` (Triton's interpreter on a CPU) is one launch."""
    from dllm.kernels import launching
    counter = DispatchCounter()
    x = torch.arange(6.0)
    with counter:                                         # an entered counter listens to launches
        with launching("inner"):
            (x + 1).sum().item()                          # three operations and a read, inside the launch
            x.tolist()                                    # a read without an operation, inside it too
        x * 2                                             # one operation outside it
    assert counter.counts["loop"].ops == 2 and counter.counts["loop"].syncs == 0
    with launching("after"):                              # an exited one no longer does
        x + 1
    assert counter.counts["loop"].ops == 2


def test_a_launch_makes_its_tensors_cuda_device_current(monkeypatch):
    """Triton launches on the current CUDA device: a launch on cuda:1 while cuda:0 is current
    switches to cuda:1 for the launch, and only then."""
    from dllm.kernels import launching
    entered = []

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            entered.append("exit")
            return False

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    for device in (torch.device("cuda", 0), torch.device("cpu"), None):
        with launching("same", device):
            pass
    assert entered == []
    with launching("other", torch.device("cuda", 1)):
        assert entered == [torch.device("cuda", 1)]
    assert entered[-1] == "exit"
    counter = DispatchCounter()
    with counter, launching("listened", torch.device("cuda", 1)):   # with listeners too
        assert entered[-1] == torch.device("cuda", 1)
    assert entered[-1] == "exit"


def test_the_counter_knows_what_makes_the_host_wait():
    x = torch.arange(6.0)
    mask, idx = x > 2, torch.tensor([0, 2])
    assert _syncs(lambda: x.sum().item()) == 1
    assert _syncs(lambda: bool((x > 1).any())) == 1
    assert _syncs(lambda: x.nonzero()) == 1
    assert _syncs(lambda: x[mask]) == 1                                 # boolean-mask indexing
    assert _syncs(lambda: x.clone().__setitem__(mask, 0.0)) == 1
    assert _syncs(lambda: torch.repeat_interleave(idx, idx)) == 1
    assert _syncs(lambda: torch.repeat_interleave(idx, idx, output_size=2)) == 0
    assert _syncs(lambda: torch.allclose(x, x)) >= 1                      # reads its answer
    assert _syncs(lambda: x.tolist()) == 1 and torch.Tensor.tolist(x) == x.tolist()   # counted, then restored
    methods = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu", "numpy")}
    assert _syncs(lambda: x.cpu()) == 1 and _syncs(lambda: x.numpy()) == 1            # no operation on a CPU
    assert {name: getattr(torch.Tensor, name) for name in methods} == methods           # restored
    assert _syncs(lambda: torch.bincount(idx)) >= 1 and _syncs(lambda: torch.histc(x)) >= 1   # sized by the data
    assert _syncs(lambda: (x[idx], torch.where(mask, x, 0.0), x.argmax(), x.cumsum(0))) == 0


def test_counts_are_deterministic_and_cover_every_forward(tiny):
    cfg = GenerationConfig(gen_length=16, block_length=8, sampler="threshold", cache="dual")
    a, b = count_decode(tiny, PROMPTS, cfg), count_decode(tiny, PROMPTS, cfg)
    assert {k: vars(c) for k, c in a.counts.items()} == {k: vars(c) for k, c in b.counts.items()}
    assert a.counts["full"].calls + a.counts["cached"].calls == a.forwards == a.steps
    assert a.counts["full"].calls == 2                 # dual refreshes everything once per block
    assert a.forwards == dllm.generate(tiny, None, PROMPTS, cfg).forwards


RAGGED = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]


@pytest.mark.parametrize("prompts", [PROMPTS, RAGGED], ids=["batch1", "ragged"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "dkv-decode", "dkv-greedy"])
def test_the_model_forward_makes_no_host_sync(tiny, cache, prompts):
    """Full and cached forwards read nothing back to the host under every policy: the loop builds
    the recompute plan, sources of the logits included, and hands over its width."""
    counts = count_decode(tiny, prompts, GenerationConfig(gen_length=16, block_length=8, sampler="threshold",
                                                          cache=cache))
    assert counts.counts["full"].calls > 0 and counts.counts["full"].syncs == 0
    assert counts.counts["cached"].syncs == 0
    if cache != "none":
        assert counts.counts["cached"].calls > 0


@pytest.mark.parametrize("preset", ["llada-tiny", "dream-tiny"])
def test_a_cached_step_dispatches_what_a_full_forward_does(preset):
    """Layer for layer a cached forward dispatches what a full forward through the cache does
    (a K/V write each, built from one index per forward); only gathering the recomputed
    columns' tokens is extra."""
    model = dllm.build_model(ModelConfig.from_name(preset), seed=0)
    counts = count_decode(model, PROMPTS, GenerationConfig(gen_length=32, block_length=16, sampler="threshold",
                                                           cache="dual"))
    full, cached = counts.per_call("full")[0], counts.per_call("cached")[0]
    assert cached <= full + 1, (cached, full)


@pytest.mark.parametrize("sampler,cache", [("threshold", "none"), ("threshold", "dual"), ("threshold", "prefix"),
                                           ("low_confidence", "dkv-decode"), ("entropy", "dual"),
                                           ("low_confidence", "dkv-decode-guard"), ("hierarchy", "none"),
                                           ("credit", "dual"), ("threshold", "vicinity"),
                                           ("dparallel", "prefix"), ("freedave", "none"), ("freedave", "dual")])
@pytest.mark.parametrize("prompts", [PROMPTS, [PROMPTS[0]] * 3, [[]]], ids=["batch1", "batch3", "empty"])
def test_the_loop_reads_the_device_once_per_step(tiny, sampler, cache, prompts):
    """One host read per step, plus the read that finds every row finished; nothing else (a
    batch reads once more only when some of its rows finish before the others)."""
    from dllm.samplers.threshold import rounded_to
    rounded_to.cache_clear()                   # thresholds rounded the first time count here too
    block = None if sampler == "entropy" else 16           # Dream's samplers decode the whole region at once
    kwargs = {"refresh": 4, "guard": 0.5} if cache == "dkv-decode-guard" else {}
    counts = count_decode(tiny, prompts, GenerationConfig(gen_length=32, block_length=block, sampler=sampler,
                                                          cache=cache.removesuffix("-guard"), cache_kwargs=kwargs))
    assert counts.counts["loop"].syncs == counts.forwards + 1, counts.counts["loop"].sync_sites


def test_dkv_greedy_reads_once_more_per_step_for_its_window(tiny):
    """Its window search runs on the host: one read of the due and free columns per step, besides
    the step's read (the window is worked out before the read, since the plan's widths need it)."""
    counts = count_decode(tiny, PROMPTS, GenerationConfig(gen_length=32, block_length=16, sampler="threshold",
                                                          cache="dkv-greedy"))
    loop = counts.counts["loop"]
    assert loop.syncs == 2 * (counts.forwards + 1), loop.sync_sites
    assert {site.split(" at ")[1].split(":")[0] for site in loop.sync_sites} == {"dllm/cache.py", "dllm/decode.py"}


# Operations the loop dispatches per step around the forward (scoring, sampler, commits, cache
# plan, bookkeeping) on llada-tiny, batch 1 and a ragged batch of 3: each is a host dispatch, and
# on a GPU a kernel launch, so a step's host time grows with them (docs/architecture.md §The loop's
# operations). Measured values, rounded up; a change that adds work to every step fails here.
LOOP_BUDGET = {("low_confidence", "none"): 145, ("threshold", "none"): 154, ("threshold", "dual"): 211,
               ("threshold", "prefix"): 216, ("low_confidence", "dkv-decode"): 216}


@pytest.mark.parametrize("sampler,cache", list(LOOP_BUDGET))
@pytest.mark.parametrize("prompts", [PROMPTS, RAGGED], ids=["batch1", "ragged"])
def test_the_loop_stays_within_its_operation_budget(tiny, sampler, cache, prompts):
    counts = count_decode(tiny, prompts, GenerationConfig(gen_length=32, block_length=16, sampler=sampler,
                                                          cache=cache))
    ops, _ = counts.per_call("loop")
    assert ops <= LOOP_BUDGET[sampler, cache], ops


@pytest.mark.parametrize("sampler", ["low_confidence", "random", "entropy", "maskgit_plus"])
@pytest.mark.parametrize("prompts", [PROMPTS, RAGGED], ids=["batch1", "ragged"])
def test_a_planned_fixed_schedule_reads_the_device_once_per_decode(tiny, sampler, prompts):
    """LLaDA's and Dream's greedy fixed schedules without a cache: the host knows every step's
    width, so the loop reads only once after the last step (every row finished, every score
    finite); Dream's plan reads its timesteps once more, at setup. It decodes what the reading
    loop decodes."""
    dream = sampler in ("entropy", "maskgit_plus")
    cfg = GenerationConfig(gen_length=32, block_length=None if dream else 16, steps=16, sampler=sampler, seed=0)
    counts = count_decode(tiny, prompts, cfg)
    assert counts.forwards == 16
    assert counts.counts["loop"].syncs == 1 + dream, counts.counts["loop"].sync_sites
    planned = dllm.generate(tiny, None, prompts, cfg)
    # a cache refreshed at every step computes what `none` computes, through the reading loop
    reading = dllm.generate(tiny, None, prompts, cfg.replace(cache="dkv-decode", cache_kwargs={"refresh": 1}))
    assert torch.equal(planned.sequences, reading.sequences) and planned.forwards == reading.forwards


@pytest.mark.parametrize("gen_length,steps,eps", [(32, 32, 1e-3), (50, 20, 1e-3), (64, 7, 0.05), (17, 17, 0.2)])
def test_dream_plans_the_counts_its_steps_commit(tiny, gen_length, steps, eps):
    """The planned widths equal the masks left at each step as torch's float32 arithmetic counts them."""
    from dllm import samplers
    from dllm.decode import build_state
    sampler = samplers.get("entropy", eps=eps)
    state = build_state(tiny, [PROMPTS[0]], GenerationConfig(gen_length=gen_length, steps=steps), gen_length)
    sampler.setup(state)
    ts = state.extra["timesteps"]
    n, want = torch.tensor(gen_length), []
    for i in range(steps):
        want.append(int(n))
        n = n - (n.float() * (1 - ts[i + 1] / ts[i])).long() if i < steps - 1 else n
    assert sampler.planned_widths(state) == want
    assert samplers.get("origin").planned_widths(state) is None
    assert samplers.get("entropy", alg_temp=0.5).planned_widths(state) is None


def test_bench_overhead_times_the_loop_outside_the_forwards(tmp_path, capsys):
    """`bench_overhead.py --time N`: a positive time per step next to the counts; a bad N is named."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_overhead
    finally:
        sys.path.pop(0)
    out = tmp_path / "rows.jsonl"
    threads = torch.get_num_threads()
    try:
        assert bench_overhead.main(["--presets", "llada-tiny", "--grid", "threshold+dual", "--time", "2",
                                    "--threads", "1", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    row = json.loads(out.read_text())
    assert row["loop_us"] > 0 and row["threads"] == 1 and row["loop"]["ops_per_call"] > 0
    assert 0 < row["forwards_s"] < row["decode_s"] and row["decode_over_forwards"] > 1
    assert row["loop_us"] == pytest.approx((row["decode_s"] - row["forwards_s"]) / row["forwards"] * 1e6, abs=0.1)
    assert row["device"] == "cpu" and row["dtype"] == "float32" and row["cuda_graphs"] is False
    assert "us/step" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--time -1 must be"):
        bench_overhead.main(["--time", "-1"])
    with pytest.raises(SystemExit, match="--cuda-graphs needs --device cuda"):
        bench_overhead.main(["--time", "1", "--cuda-graphs"])
    with pytest.raises(SystemExit, match="--profile needs --time N"):
        bench_overhead.main(["--profile", str(tmp_path / "profile")])
    profiled = tmp_path / "profiled.jsonl"
    assert bench_overhead.main(["--presets", "llada-tiny", "--grid", "low_confidence+none", "--gen-length", "16",
                                "--block-length", "16", "--time", "1", "--profile", str(tmp_path / "profile"),
                                "--out", str(profiled)]) == 0
    row = json.loads(profiled.read_text())
    assert row["profiled_steps"] == row["forwards"] and 0 < row["profiled_forwards_us"] < row["profiled_wall_us"]
    assert "device_busy_us" not in row    # CUDA only
    assert "aten::mm" in (tmp_path / "profile" / "llada-tiny-B1-low_confidence-none.txt").read_text()
    shipped = tmp_path / "shipped.jsonl"
    assert bench_overhead.main(["--checkpoint", "llada-pb-tiny", "--grid", "low_confidence+none", "--gen-length", "16",
                                "--block-length", "16", "--out", str(shipped)]) == 0
    assert json.loads(shipped.read_text())["preset"] == "llada-pb-tiny"
    assert bench_overhead.main(["--checkpoint", str(tmp_path / "missing")]) == 2
    assert "no checkpoint folder" in capsys.readouterr().err


def test_device_busy_time_counts_each_kernel_once():
    """An operator's self device time includes the kernels it launched, which the profiler also
    lists as rows of their own: the busy time sums the kernels' rows only."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_overhead
    finally:
        sys.path.pop(0)
    events = [SimpleNamespace(device_type=DeviceType.CPU, self_device_time_total=10.0),    # aten::mm
              SimpleNamespace(device_type=DeviceType.CUDA, self_device_time_total=10.0),   # its kernel
              SimpleNamespace(device_type=DeviceType.CUDA, self_device_time_total=4.0),    # a replayed one
              SimpleNamespace(device_type=DeviceType.CUDA, self_device_time_total=99.0, is_user_annotation=True)]
    assert bench_overhead.device_busy_us(events) == 14.0
