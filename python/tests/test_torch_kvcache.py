"""flashgen.torch.attention_with_kvcache on the GPU: each sequence's output and lse against its float64 reference
(SDPA's MATH backend) over contiguous and paged caches with appended tokens, fixed and chosen split counts, sliding
windows, the custom op under torch.library.opcheck and CUDA-graph capture, and the arguments it refuses.
"""

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _calls as fg_calls, _kvcache as fg_kvcache  # noqa: E402
from flashgen.torch import FlashgenArgumentError  # noqa: E402


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=generator).to(dtype)


def _check(out, lse, q, keys, values, lens, dtype):
    """Sequence b's out and lse against attention of its new queries over keys[b][:lens[b]] (bottom-right causal)."""
    for b, n in enumerate(lens):
        qs, ks, vs = q[b:b + 1], keys[b:b + 1, :n], values[b:b + 1, :n]
        group = qs.shape[2] // ks.shape[2]
        ks, vs = (t.repeat_interleave(group, dim=2) for t in (ks, vs))
        want, want_lse, *_ = testsupport.reference_attention(qs, ks, vs, torch.zeros_like(qs), "bottom_right", None,
                                                             "bshd")
        allowed = 2 * testsupport.EPSILON[str(dtype).replace("torch.", "")] * want.abs().max().item() + 1e-3
        assert testsupport.max_error(out[b:b + 1], want) <= allowed, testsupport.mismatch_report(
            "out", out[b:b + 1], want, allowed)
        assert testsupport.max_error(lse[b:b + 1], want_lse) <= 1e-3


@pytest.mark.parametrize("page_size", [0, 16, 64])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_decode_matches_reference_with_append(page_size, num_splits):
    batch, capacity, hq, hkv, d, new = 3, 256, 8, 2, 128, 2
    lens = [100, 0, 254 - new]
    k_logical, v_logical = _randn(batch, capacity, hkv, d, seed=1), _randn(batch, capacity, hkv, d, seed=2)
    k_new, v_new = _randn(batch, new, hkv, d, seed=3), _randn(batch, new, hkv, d, seed=4)
    q = _randn(batch, new, hq, d, seed=5)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if page_size:
        pages = capacity // page_size
        order = torch.randperm(batch * pages, device="cuda")
        table = order.view(batch, pages).to(torch.int32)
        k_cache, v_cache = (torch.empty(batch * pages, page_size, hkv, d, device="cuda", dtype=torch.bfloat16)
                            for _ in range(2))
        k_cache[order] = k_logical.reshape(batch * pages, page_size, hkv, d)
        v_cache[order] = v_logical.reshape(batch * pages, page_size, hkv, d)
    else:
        table, k_cache, v_cache = None, k_logical.clone(), v_logical.clone()
    out, lse = fgt.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                          block_table=table, causal=True, num_splits=num_splits,
                                          return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, hq, new) and lse.dtype == torch.float32
    for b, n in enumerate(lens):
        k_logical[b, n:n + new], v_logical[b, n:n + new] = k_new[b], v_new[b]
    _check(out, lse, q, k_logical, v_logical, [n + new for n in lens], torch.bfloat16)
    if page_size:  # the appended rows landed in the right pages
        pages = capacity // page_size
        assert torch.equal(k_cache[order].reshape(batch, capacity, hkv, d), k_logical)
    else:
        assert torch.equal(k_cache, k_logical) and torch.equal(v_cache, v_logical)


@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("window_size,causal,new", [((256, -1), True, 1), ((100, 20), False, 4)])
def test_decode_within_a_window_matches_reference(page_size, window_size, causal, new):
    """Caches shorter and much longer than the window; the window lies about each sequence's last key."""
    batch, capacity, hq, hkv, d = 3, 2048, 8, 2, 64
    lens = [5, 300, 2000 - new]
    k_logical, v_logical = (_randn(batch, capacity, hkv, d, dtype=torch.float16, seed=s) for s in (20, 21))
    k_new, v_new = (_randn(batch, new, hkv, d, dtype=torch.float16, seed=s) for s in (22, 23))
    q = _randn(batch, new, hq, d, dtype=torch.float16, seed=24)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    table, k_cache, v_cache = None, k_logical.clone(), v_logical.clone()
    if page_size:  # the pages in reverse order
        table, k_cache, v_cache = testsupport.reversed_pages(k_logical, v_logical, page_size)
    for num_splits in (0, 1, 4):
        out, lse = fgt.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                              block_table=table, causal=causal, window_size=window_size,
                                              num_splits=num_splits, return_softmax_lse=True)
        window = (window_size[0], 0) if causal else window_size
        for b, n in enumerate(lens):
            keys, values = (torch.cat([t[b:b + 1, :n], fresh[b:b + 1]], dim=1)
                            for t, fresh in ((k_logical, k_new), (v_logical, v_new)))
            visible = testsupport.window_keys(new, n + new, window, q.device)
            qs = q[b:b + 1]
            want, want_lse, _ = testsupport.float64_bshd_attention(qs, keys, values, torch.zeros_like(qs), d ** -0.5,
                                                                   visible)
            testsupport.assert_close_to_float64(f"out of sequence {b}, num_splits {num_splits}", out[b:b + 1], want,
                                                torch.float16)
            assert testsupport.max_error(lse[b:b + 1], want_lse) <= 1e-3


@pytest.mark.parametrize("page_size", [0, 16])
def test_decode_with_a_soft_cap_and_alibi_matches_reference(page_size):
    """Gemma 2's soft cap and BLOOM's ALiBi (slopes per sequence, about each sequence's last key) on a decode step
    with appended tokens, every split count."""
    batch, capacity, hq, hkv, d, new = 3, 512, 8, 2, 64, 2
    lens = [5, 0, 500 - new]
    k_logical, v_logical = (_randn(batch, capacity, hkv, d, dtype=torch.float16, seed=s) for s in (30, 31))
    k_new, v_new = (_randn(batch, new, hkv, d, dtype=torch.float16, seed=s) for s in (32, 33))
    q = _randn(batch, new, hq, d, dtype=torch.float16, seed=34)
    slopes = torch.tensor([[2.0 ** (-8.0 * (h + 1) / hq) * (1 + b) for h in range(hq)] for b in range(batch)],
                          device="cuda")
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    table, k_cache, v_cache = None, k_logical.clone(), v_logical.clone()
    if page_size:
        table, k_cache, v_cache = testsupport.reversed_pages(k_logical, v_logical, page_size)
    for num_splits in (0, 1, 4):
        out, lse = fgt.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                              block_table=table, causal=True, softcap=3.0, alibi_slopes=slopes,
                                              num_splits=num_splits, return_softmax_lse=True)
        for b, n in enumerate(lens):
            keys, values = (torch.cat([t[b:b + 1, :n], fresh[b:b + 1]], dim=1)
                            for t, fresh in ((k_logical, k_new), (v_logical, v_new)))
            visible = testsupport.visible_keys(new, n + new, "bottom_right", q.device)
            bias = testsupport.alibi_bias(slopes[b], new, n + new)
            qs = q[b:b + 1]
            want, want_lse, _ = testsupport.float64_bshd_attention(qs, keys, values, torch.zeros_like(qs), d ** -0.5,
                                                                   visible, softcap=3.0, bias=bias)
            testsupport.assert_close_to_float64(f"out of sequence {b}, num_splits {num_splits}", out[b:b + 1], want,
                                                torch.float16)
            assert testsupport.max_error(lse[b:b + 1], want_lse) <= 1e-3


def test_a_warm_call_repoints_every_tensor_of_its_plan(monkeypatch):
    """A second call of a signature (paged cache, appended tokens, bf16 sinks, ALiBi slopes) skips the argument
    checks through its plan and reads each of its own tensors: its output is bitwise that of the same call made
    cold. Eager calls keep their plans in either backend."""
    batch, capacity, hq, hkv, d, new, page = 2, 96, 4, 2, 64, 1, 16

    def inputs(seed):
        k_logical, v_logical = (_randn(batch, capacity, hkv, d, seed=seed + s) for s in (0, 1))
        table, k_cache, v_cache = testsupport.reversed_pages(k_logical, v_logical, page)
        table = table[torch.randperm(batch, generator=torch.Generator().manual_seed(seed))].contiguous()
        return {"q": _randn(batch, new, hq, d, seed=seed + 2), "k_cache": k_cache, "v_cache": v_cache,
                "k": _randn(batch, new, hkv, d, seed=seed + 3), "v": _randn(batch, new, hkv, d, seed=seed + 4),
                "cache_seqlens": torch.tensor([seed % 50 + 1, capacity - new - seed % 7], dtype=torch.int32,
                                              device="cuda"),
                "block_table": table, "sinks": _randn(hq, seed=seed + 5) + 2.0,
                "alibi_slopes": torch.rand(hq, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))}

    def call(t):
        return fgt.attention_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"],
                                          cache_seqlens=t["cache_seqlens"], block_table=t["block_table"], causal=True,
                                          sinks=t["sinks"], alibi_slopes=t["alibi_slopes"], num_splits=3,
                                          return_softmax_lse=True)

    first, second = inputs(10), inputs(20)
    call(first)
    cold = {name: t.clone() for name, t in second.items()}
    checked = []
    real_check = fg_kvcache._check_kvcache_inputs
    monkeypatch.setattr(fg_kvcache, "_check_kvcache_inputs", lambda *a: checked.append(1) or real_check(*a))
    warm_out, warm_lse = call(second)
    assert not checked, "the warm call took the checked path, not its plan"
    fg_calls._plans.kvcache.clear()
    cold_out, cold_lse = call(cold)
    assert checked
    assert torch.equal(warm_out, cold_out) and torch.equal(warm_lse, cold_lse)
    assert torch.equal(second["k_cache"], cold["k_cache"]) and torch.equal(second["v_cache"], cold["v_cache"])


def test_a_growing_cache_through_one_plan_and_the_decode_step():
    """transformers' decode steps (decode_step): q and the cache [batch, heads, seqlen, head_dim] read in place, the
    cache one key longer at each call (a view of a larger buffer, its capacity and strides new each time), sinks in
    the model's dtype. Warm calls through the plan the first call made (split workspace from flashgen's pool, or
    inside a CUDA graph capture from torch's allocator) give the bits of a cold call at every length, and without
    sinks the float64 reference's output."""
    batch, hq, hkv, d = 2, 8, 2, 128
    q = _randn(batch, hq, 1, d, seed=50)
    k_rows, v_rows = (_randn(batch, hkv, 3000, d, seed=s) for s in (51, 52))
    sinks = _randn(hq, seed=53)

    def step(n, call, with_sinks=sinks):
        return call(q, k_rows[:, :, :n], v_rows[:, :, :n], None, True, (-1, -1), 0.0, with_sinks, 0)

    def cold(*args):
        fg_calls._plans.kvcache.clear()
        fg_kvcache._DECODE_ARGUMENTS.clear()
        return fg_kvcache.decode_step(*args)

    step(2000, fg_kvcache.decode_step)
    for n in (2001, 2002, 2500, 2999, 17):
        plans = len(fg_calls._plans.kvcache)
        warm = step(n, fg_kvcache.decode_step)
        assert warm.shape == (batch, 1, hq, d)
        assert len(fg_kvcache._DECODE_ARGUMENTS) == 1 and len(fg_calls._plans.kvcache) == plans
        assert torch.equal(warm, step(n, cold)), n
        no_sinks = step(n, fg_kvcache.decode_step, with_sinks=None)
        want, *_ = testsupport.float64_bshd_attention(q.transpose(1, 2), k_rows[:, :, :n].transpose(1, 2),
                                                      v_rows[:, :, :n].transpose(1, 2), q.transpose(1, 2), d ** -0.5)
        testsupport.assert_close_to_float64(f"{n} keys", no_sinks, want, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(2998, fg_kvcache.decode_step)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step(2999, fg_kvcache.decode_step)
    got.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, step(2999, cold))


def test_torch_compile_keeps_a_decode_user_variant_in_its_graph():
    """Under torch.compile(fullgraph=True) a KV-cache call with a user variant (a mask_mod over a tensor argument, a
    score_bias over a number) is the op flashgen::variant_attention_kvcache in the graph (a graph break would raise):
    out, lse and the caches the new tokens were appended to equal eager's bit for bit."""
    torch._dynamo.reset()
    batch, capacity, hq, hkv, d, new = 2, 256, 8, 2, 64, 2
    q, k_new, v_new = (_randn(batch, new, heads, d, seed=s) for heads, s in ((hq, 60), (hkv, 61), (hkv, 62)))
    k_cache, v_cache = (_randn(batch, capacity, hkv, d, seed=s) for s in (63, 64))
    lens = torch.tensor([100, 37], dtype=torch.int32, device="cuda")
    allowed = (torch.arange(capacity, device="cuda") % 3 != 0).to(torch.uint8)

    def step(q, k_cache, v_cache, k, v):
        return fgt.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True, num_splits=2,
                                          return_softmax_lse=True, mask_mod="return allowed[kv_idx] != 0;",
                                          score_bias="return -slope * (float)(kv_idx % 7);",
                                          variant_args={"allowed": allowed, "slope": 0.125})

    eager_caches = (k_cache.clone(), v_cache.clone())
    eager = step(q, *eager_caches, k_new, v_new)
    compiled_caches = (k_cache.clone(), v_cache.clone())
    compiled = torch.compile(step, fullgraph=True)(q, *compiled_caches, k_new, v_new)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    assert torch.equal(compiled_caches[0], eager_caches[0]) and torch.equal(compiled_caches[1], eager_caches[1])
    assert not torch.equal(eager_caches[0], k_cache)  # the new tokens were appended


def test_an_int_cache_length_and_full_caches():
    q, k, v = _randn(2, 1, 4, 64, dtype=torch.float16, seed=6), *(_randn(2, 80, 4, 64, dtype=torch.float16, seed=s)
                                                                    for s in (7, 8))
    out = fgt.attention_with_kvcache(q, k, v, cache_seqlens=50)
    _, lse = fgt.attention_with_kvcache(q, k, v, return_softmax_lse=True)
    want, want_lse, *_ = testsupport.reference_attention(q, k[:, :50], v[:, :50], torch.zeros_like(q), "none", None,
                                                         "bshd")
    assert testsupport.max_error(out, want) <= 2e-3
    _, full_lse, *_ = testsupport.reference_attention(q, k, v, torch.zeros_like(q), "none", None, "bshd")
    assert testsupport.max_error(lse, full_lse) <= 1e-3


def test_the_op_passes_opcheck_and_a_cuda_graph_captures_it():
    q, k, v = _randn(2, 1, 8, 64, seed=9), _randn(2, 512, 2, 64, seed=10), _randn(2, 512, 2, 64, seed=11)
    lens = torch.tensor([500, 17], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.flashgen.attention_kvcache.default, (q, k, v, None, None, lens, None, 0.0,
                                                                         "bottom_right", 4))
    want = fgt.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, num_splits=4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fgt.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, num_splits=4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = fgt.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, num_splits=4)
    got.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_bad_arguments_are_named():
    q, k = _randn(2, 1, 8, 64, seed=12), _randn(2, 64, 2, 64, seed=13)
    with pytest.raises(FlashgenArgumentError, match="cache_seqlens: expected a 1-d torch.int32"):
        fgt.attention_with_kvcache(q, k, k, cache_seqlens=torch.zeros(2, device="cuda"))
    with pytest.raises(FlashgenArgumentError, match="k and v: give both"):
        fgt.attention_with_kvcache(q, k, k, k=k[:, :1])
    with pytest.raises(FlashgenArgumentError, match="block_table.shape\\[0\\] is 3"):
        fgt.attention_with_kvcache(q, k, k, block_table=torch.zeros(3, 4, dtype=torch.int32, device="cuda"))
    with pytest.raises(FlashgenArgumentError, match="cache_leftpad: not supported"):
        fgt.attention_with_kvcache(q, k, k, cache_leftpad=torch.zeros(2, dtype=torch.int32, device="cuda"))
    with pytest.raises(FlashgenArgumentError, match="softcap must be 0.0 \\(none\\) or a positive finite cap"):
        fgt.attention_with_kvcache(q, k, k, softcap=-1.0)
    with pytest.raises(FlashgenArgumentError, match="alibi_slopes must be float32"):
        fgt.attention_with_kvcache(q, k, k, alibi_slopes=torch.ones(3, device="cuda"))
    with pytest.raises(FlashgenArgumentError, match="page_size\\) must be a multiple of 16"):
        fgt.attention_with_kvcache(q, k[:, :40], k[:, :40], block_table=torch.zeros(2, 4, dtype=torch.int32,
                                                                                    device="cuda"))
    with pytest.raises(FlashgenArgumentError, match="num_splits must be in \\[0, 128\\]"):
        fgt.attention_with_kvcache(q, k, k, num_splits=500)


@pytest.mark.parametrize("page_size", [0, 16])
def test_decode_with_a_user_tree_mask_and_bias_matches_reference(page_size):
    """Speculative decoding's draft tree as a user's mask_mod (4 appended drafts: draft 2 branches off draft 0, so it
    does not see draft 1), cache_seqlens passed among variant_args to find the drafts' keys, and a per-head score_bias;
    every split count."""
    batch, capacity, hq, hkv, d, new = 3, 320, 8, 2, 64, 4
    lens = [5, 0, 300]
    k_logical, v_logical = (_randn(batch, capacity, hkv, d, dtype=torch.float16, seed=s) for s in (40, 41))
    k_new, v_new = (_randn(batch, new, hkv, d, dtype=torch.float16, seed=s) for s in (42, 43))
    q = _randn(batch, new, hq, d, dtype=torch.float16, seed=44)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool, device="cuda")
    head_bias = torch.linspace(-0.5, 0.5, hq, device="cuda")
    table, k_cache, v_cache = None, k_logical.clone(), v_logical.clone()
    if page_size:
        table, k_cache, v_cache = testsupport.reversed_pages(k_logical, v_logical, page_size)
    for num_splits in (0, 1, 4):
        k_now, v_now = k_cache.clone(), v_cache.clone()  # each call appends the drafts again
        out, lse = fgt.attention_with_kvcache(
            q, k_now, v_now, k_new, v_new, cache_seqlens=cache_seqlens, block_table=table, causal=True,
            num_splits=num_splits, return_softmax_lse=True,
            mask_mod="const int draft = kv_idx - lens[batch];\nreturn draft < 0 || (draft < 4 && tree[4 * q_idx + draft]);",
            score_bias="return head_bias[head] * float(kv_idx % 5);",
            variant_args={"lens": cache_seqlens, "tree": tree, "head_bias": head_bias})
        for b, n in enumerate(lens):
            keys, values = (torch.cat([t[b:b + 1, :n], fresh[b:b + 1]], dim=1)
                            for t, fresh in ((k_logical, k_new), (v_logical, v_new)))
            visible = testsupport.visible_keys(new, n + new, "bottom_right", q.device)
            visible[:, n:] &= tree
            positions = torch.arange(n + new, device="cuda") % 5
            bias = (head_bias[:, None, None] * positions[None, None, :]).expand(hq, new, n + new)[None]
            qs = q[b:b + 1]
            want, want_lse, _ = testsupport.float64_bshd_attention(qs, keys, values, torch.zeros_like(qs), d ** -0.5,
                                                                   visible, bias=bias)
            testsupport.assert_close_to_float64(f"out of sequence {b}, num_splits {num_splits}", out[b:b + 1], want,
                                                torch.float16)
            assert testsupport.max_error(lse[b:b + 1], want_lse) <= 1e-3
