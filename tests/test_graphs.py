"""CUDA graphs of the inference forward (`dllm.models.graphs`): a replay gives the eager forward's
logits and cache writes bit for bit, generation keeps its tokens under every cache policy on a
ragged batch, graphs are reused across steps and dropped when the weights move. The GPU tests carry
the `gpu` mark; the errors are checked everywhere."""
import warnings

import pytest
import torch

import dllm
from dllm.cache import KVCache, policies_for
from dllm.config import ModelConfig
from dllm.models.graphs import ForwardGraphs, _Graph

CUDA = torch.cuda.is_available()
PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100]]   # ragged: left padding 0, 4, 2


# -- everywhere -----------------------------------------------------------------------------------
def test_graphs_need_a_cuda_model(llada_dir):
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)
    with pytest.raises(ValueError, match=r"need the model on a CUDA device; it is on cpu"):
        model.set_cuda_graphs(True)
    with pytest.raises(ValueError, match=r"enabled must be True or False, got 'yes'"):
        model.set_cuda_graphs("yes")
    model.set_cuda_graphs(False)                          # off is always allowed
    assert model.cuda_graphs is None
    with pytest.raises(ValueError, match=r"cuda_graphs=True needs a CUDA device, got device 'cpu'"):
        dllm.load(llada_dir, device="cpu", cuda_graphs=True)
    with pytest.raises(ValueError, match=r"cuda_graphs must be True or False, got 1"):
        dllm.load(llada_dir, device="cpu", cuda_graphs=1)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"max_graphs must be an integer >= 1"):
            ForwardGraphs(bad)
        with pytest.raises(ValueError, match=r"capture_after must be an integer >= 1"):
            ForwardGraphs(4, bad)


def test_graphs_of_a_moe_model_need_bfloat16(lladamoe):
    model, _ = lladamoe
    with pytest.raises(ValueError, match=r"CUDA graphs of a mixture-of-experts model need it in bfloat16 "
                                         r"\(its experts in torch.float32 read their token counts on the host"):
        model.set_cuda_graphs(True)


def test_cli_refuses_graphs_without_cuda(capsys):
    from dllm.cli import main
    if CUDA:
        pytest.skip("CUDA is present")
    assert main(["generate", "hi", "--device", "cpu", "--cuda-graphs"]) == 2
    assert "cuda_graphs=True needs a CUDA device" in capsys.readouterr().err


class _ReplayOnHost:
    """Stands in for a CUDA graph on machines without one: replaying reruns the captured function
    on the captured (static) inputs and writes its result into the captured output, which is what
    a replay does to memory."""

    def __init__(self, fn, static, fixed):
        self.fn, self.static, self.fixed, self.output = fn, static, fixed, None

    def replay(self):
        self.output.copy_(self.fn(**self.static, **self.fixed))


class _HostGraphs(ForwardGraphs):
    def _capture(self, fn, inputs, fixed, device):
        static = {n: None if t is None else t.clone() for n, t in inputs.items()}
        graph = _ReplayOnHost(fn, static, fixed)
        graph.output = fn(**static, **fixed)
        self.captures += 1
        return _Graph(graph, static, graph.output)


def test_layouts_run_eagerly_until_captured_and_replays_read_fresh_inputs():
    calls = []

    def fn(a, b, scale):
        calls.append(1)
        return a * scale + (0 if b is None else b)

    g = _HostGraphs(max_graphs=2, capture_after=2)
    x = torch.arange(4.0)
    earlier = []
    for step, key in enumerate(["p", "p", "p", "q", "r", "q", "r", "p"]):
        a = x + step
        out = g.run(fn, (key,), {"a": a, "b": None}, scale=3.0)
        assert torch.equal(out, a * 3.0), (step, key)              # the inputs of this call, not the captured ones
        earlier.append((out, out.clone()))
        assert all(torch.equal(o, kept) for o, kept in earlier), step   # a later replay leaves earlier results alone
    # p: eager, captured, replayed; q, r: eager, then captured (r's capture drops p); p again: eager
    assert (g.eager, g.captures, g.replays, len(g)) == (4, 3, 4, 2)
    assert list(g._graphs) == [("q",), ("r",)]
    assert len(calls) == g.eager + g.captures + g.replays           # this stand-in runs fn at each of them
    g.clear()
    assert len(g) == 0 and g.run(fn, ("q",), {"a": x, "b": x}, scale=1.0).equal(2 * x) and g.eager == 5


def test_a_layout_whose_capture_fails_runs_eagerly_for_good():
    class Refusing(_HostGraphs):
        def _capture(self, fn, inputs, fixed, device):
            if fn.__name__ == "refused":
                raise RuntimeError("operation not permitted when stream is capturing")
            return super()._capture(fn, inputs, fixed, device)

    def refused(a):
        return a + 1

    g = Refusing(capture_after=1)
    x = torch.zeros(3)
    with pytest.warns(RuntimeWarning, match=r"CUDA graph capture failed \(RuntimeError: operation not permitted"):
        assert g.run(refused, ("k",), {"a": x}).equal(x + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                # no second attempt, no second warning
        for _ in range(3):
            assert g.run(refused, ("k",), {"a": x + 1}).equal(x + 2)
    assert (g.eager, g.captures, g.replays, len(g)) == (4, 0, 0, 0)


def test_loading_weights_drops_graphs_and_odd_shaped_inputs_are_refused():
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)
    model._graphs = ForwardGraphs()                                   # as set_cuda_graphs would on a GPU
    model._graphs.persistent(("kv",), lambda: torch.zeros(2))
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    assert not model._graphs._kept                                    # new storage: graphs and buffers dropped
    model._graphs = None
    x = torch.zeros(2, 9, dtype=torch.long)
    with pytest.raises(ValueError, match=r"position_ids must have the canvas shape \(2, 9\) of x, got \(1, 9\)"):
        model(x, position_ids=torch.arange(9)[None])
    with pytest.raises(ValueError, match=r"key_valid must have the canvas shape \(2, 9\) of x \(or \(2, 9, 9\), one key mask "
                                         r"per query\), got \(2, 10\)"):
        model(x, key_valid=torch.ones(2, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_valid must be a bool tensor \(True: a key to attend to\), got "
                                         r"torch.float32; an attention mask of 0/1 numbers converts with mask.bool\(\)"):
        model(x, key_valid=torch.ones(2, 9))                       # sdpa would add it to the scores


def test_kept_buffers_are_shared_per_key_and_the_oldest_go():
    g = ForwardGraphs()
    made = []

    def make(i):
        return lambda: made.append(i) or torch.full((2,), float(i))

    first = g.persistent(("kv", 0), make(0))
    assert g.persistent(("kv", 0), make(99)) is first and made == [0]
    for i in range(1, g.max_kept + 1):
        g.persistent(("kv", i), make(i))
    assert ("kv", 0) not in g._kept and len(g._kept) == g.max_kept       # the least recently used went
    g.clear()
    assert not g._kept


def test_kept_buffers_are_leased_to_one_live_holder():
    g = ForwardGraphs()

    class Holder:
        pass

    a, b = Holder(), Holder()
    kept = g.persistent(("kv", 0), lambda: torch.zeros(2), holder=a)
    assert g.persistent(("kv", 0), lambda: torch.zeros(2), holder=a) is kept      # its own lease
    other = g.persistent(("kv", 0), lambda: torch.ones(2), holder=b)
    assert other is not kept and other[0] == 1                                     # a fresh one, not kept
    del a
    assert g.persistent(("kv", 0), lambda: torch.ones(2), holder=b) is kept        # the lease ended with a
    # a lease goes with its object: once evicted (or cleared), the key's new object is kept for its holder
    c = Holder()
    for i in range(1, g.max_kept + 1):
        g.persistent(("kv", i), lambda: torch.zeros(2), holder=c)
    assert ("kv", 0) not in g._kept
    again = g.persistent(("kv", 0), lambda: torch.zeros(2), holder=c)
    assert g.persistent(("kv", 0), lambda: torch.zeros(2), holder=c) is again
    g.clear()
    fresh = g.persistent(("kv", 2), lambda: torch.zeros(2), holder=b)     # c held it before the clear
    assert g.persistent(("kv", 2), lambda: torch.zeros(2), holder=b) is fresh


def test_a_decoder_built_beside_a_running_one_keeps_its_own_buffers(llada_dir):
    """With graphs on, a fresh decoder of the same layout (another batch, rows about to join) must
    not reset the running decoder's K/V."""
    from dllm.decode import Decoder, build_state, resolve_request

    model, _ = dllm.load(llada_dir, dtype="float32")
    model._graphs = ForwardGraphs()
    config = dllm.GenerationConfig(sampler="threshold", gen_length=16, block_length=8, cache="dual")

    def decoder(prompt):
        request = resolve_request(model, config)
        return Decoder(model, build_state(model, [prompt], request.config, request.block_length), request)

    running = decoder([5, 17, 33])
    kept = running.request.policy.kv
    for t in kept.k:
        t.fill_(1.0)                                     # what its forwards stored
    joining = decoder([64, 3, 12])
    assert joining.request.policy.kv is not kept and all(bool((t == 1).all()) for t in kept.k)
    del running                                          # done: the next decode replays on the kept buffers
    assert decoder([7, 8, 9]).request.policy.kv is kept


def test_a_move_that_keeps_every_tensor_in_place_keeps_the_captured_graphs():
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), "sdpa", seed=0)
    model._graphs = ForwardGraphs()
    model._graphs._graphs["layout"] = None                         # a captured forward, as far as the model knows
    model.to("cpu")
    model.to(torch.float32)
    assert len(model._graphs) == 1
    model.to(torch.float64)                                         # new storage: the capture points at the old one
    assert len(model._graphs) == 0


# -- on a GPU -------------------------------------------------------------------------------------
def _model(name, dtype):
    return dllm.build_model(ModelConfig.from_name(name), "sdpa", dtype=dtype, device="cuda", seed=0, init_std=0.3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_replays_equal_eager_forwards_bit_for_bit(name, dtype):
    """The same sequence of forwards (full refreshes, ragged partial plans, logits at fewer columns,
    a padding mask, a subset of the cache rows) eagerly and as graphs: equal logits and equal K/V
    buffers after every call; a layout met again replays instead of capturing."""
    model = _model(name, dtype)
    B, L = 3, 29
    gen = torch.Generator(device="cuda").manual_seed(0)
    caches = [KVCache.for_model(model, B, L) for _ in range(2)]
    key_valid = torch.ones(B, L, dtype=torch.bool, device="cuda")
    key_valid[1, :4] = False
    calls = []
    for step in range(6):
        x = torch.randint(0, 300, (B, L), generator=gen, device="cuda")
        calls.append(dict(x=x, logits_at=torch.arange(20, 28, device="cuda").expand(B, 8), positions=None,
                          key_valid=key_valid, rows=None))
        plan = torch.stack([torch.randperm(L, generator=gen, device="cuda")[:6].sort().values for _ in range(B)])
        at = plan[:, :3] if step % 2 else plan[:, :5]
        calls.append(dict(x=x, logits_at=at, positions=plan, key_valid=key_valid, rows=None))
        sub = torch.tensor([0, 2], device="cuda")
        calls.append(dict(x=x[sub], logits_at=at[sub], positions=plan[sub], key_valid=None, rows=sub))
    with torch.no_grad():
        outs = []
        for graphs, cache in zip((False, True), caches):
            model.set_cuda_graphs(graphs, capture_after=1)
            got = []
            for c in calls:
                got.append(model(c["x"], c["logits_at"], positions=c["positions"], key_valid=c["key_valid"],
                                 cache=cache, rows=c["rows"]))
                got.append([t.clone() for t in cache.k + cache.v])
            outs.append(got)
        for i, (eager, graphed) in enumerate(zip(*outs)):
            if isinstance(eager, list):
                assert all(torch.equal(a, b) for a, b in zip(eager, graphed)), f"cache after call {i // 2}"
            else:
                assert torch.equal(eager, graphed), f"logits of call {i // 2}"
        stats = model.cuda_graphs
        assert stats.replays == len(calls) and stats.captures < len(calls) and len(stats) == stats.captures
        # no cache: full forwards with logits at some columns are graphed too
        x = calls[0]["x"]
        model.set_cuda_graphs(False)
        eager = model(x, calls[0]["logits_at"], key_valid=key_valid)
        model.set_cuda_graphs(True)                   # capture_after=2: the first call of a layout stays eager
        for _ in range(3):
            assert torch.equal(model(x, calls[0]["logits_at"], key_valid=key_valid), eager)
        g = model.cuda_graphs
        assert (g.eager, g.captures, g.replays) == (1, 1, 2)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_generation_keeps_its_tokens_under_every_policy(family, request):
    model, tok = dllm.load(request.getfixturevalue(f"{family}_dir"), dtype="float32", device="cuda")
    cases = [("low_confidence", {}), ("threshold", {"tau": 0.15})]
    if family == "dream":
        cases.append(("entropy", {}))
    for policy in policies_for(model.config):
        for sampler, args in cases:
            kw = dict(gen_length=16, block_length=8, steps=16, seed=3, sampler=sampler, sampler_kwargs=args,
                      cache=policy)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_cuda_graphs(False)
                eager = dllm.generate(model, tok, PROMPTS, **kw)
                model.set_cuda_graphs(True, capture_after=1)
                graphed = dllm.generate(model, tok, PROMPTS, **kw)
                captured = model.cuda_graphs.captures
                again = dllm.generate(model, tok, PROMPTS, **kw)       # replays only: same layouts, same buffers
            assert model.cuda_graphs.captures == captured, (policy, sampler)
            assert torch.equal(graphed.sequences, eager.sequences), (policy, sampler)
            assert torch.equal(again.sequences, eager.sequences), (policy, sampler)
            assert graphed.nfe == eager.nfe, (policy, sampler)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_least_recently_used_graphs_go_and_moving_the_model_drops_them():
    model = _model("llada-tiny", torch.float32)
    model.set_cuda_graphs(True, max_graphs=2, capture_after=1)
    x = torch.randint(0, 300, (1, 20), device="cuda")
    cache = KVCache.for_model(model, 1, 20)
    cache.k[0].fill_(1.0)
    again = KVCache.for_model(model, 1, 20)     # one layout, one set of buffers: a later request replays
    assert again is cache and not again.k[0].any() and KVCache.for_model(model, 2, 20) is not cache
    with torch.no_grad():
        model(x)                                                      # no cache, logits everywhere: eager
        assert model.cuda_graphs.captures == 0
        for q in (1, 2, 3, 1):
            model(x, torch.arange(q, device="cuda")[None], positions=torch.arange(4, device="cuda")[None],
                  cache=cache)
        assert len(model.cuda_graphs) == 2 and model.cuda_graphs.captures == 4   # q=1 was dropped, captured again
        model.to(torch.float16)
        assert len(model.cuda_graphs) == 0
        model.cpu()
        with pytest.raises(ValueError, match=r"CUDA graphs are on but the input is on cpu"):
            model(x.cpu(), torch.arange(2)[None], cache=KVCache.for_model(model, 1, 20))

