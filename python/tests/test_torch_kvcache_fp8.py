"""flashgen.torch.attention_with_kvcache over FP8 caches (torch.float8_e4m3fn, torch.float8_e5m2) with k_scale and
v_scale. On any machine with torch: the scales refused, each named, through meta tensors. On a GPU: the caches' formats
refused when mixed; and on sm_89 and newer each sequence's out and lse against float64 attention over the dequantized
cache (k_cache.double() * k_scale) for contiguous and paged caches and scales per tensor, per kv head and per (sequence,
kv head), the appended tokens stored bit for bit as k / k_scale rounded to the nearest FP8 value and saturated, a warm
call through its plan and a CUDA graph replay reading the scales' current values, caches of one layout in each format
one after another, and torch.compile's graph.
"""

import pytest

import testsupport

_missing = testsupport.torch_missing()
if _missing:
    pytest.skip(f"flashgen.torch tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _calls as fg_calls, _kvcache as fg_kvcache  # noqa: E402
from flashgen.torch import FlashgenArgumentError  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# The largest finite value of each format: where the library saturates a new token.
_FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_bad_scales_are_named():
    q, k8, k16 = _meta(2, 1, 8, 128), _meta(2, 64, 2, 128, dtype=E4M3), _meta(2, 64, 2, 128)
    one = _meta(2, dtype=torch.float32)
    # An FP8 cache gives out in q's dtype, through the fake kernel.
    out = fgt.attention_with_kvcache(q, k8, k8, k_scale=one, v_scale=_meta(2, 2, dtype=torch.float32))
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    with pytest.raises(FlashgenArgumentError, match=r"k_scale: given for a 16-bit cache \(k_cache.dtype is "
                                                    r"torch.bfloat16\)"):
        fgt.attention_with_kvcache(q, k16, k16, k_scale=one)
    with pytest.raises(FlashgenArgumentError, match="v_scale: given for a 16-bit cache"):
        fgt.attention_with_kvcache(q, k16, k16, v_scale=one)
    with pytest.raises(FlashgenArgumentError, match=r"k_scale must be float32 of shape \(\) or \[1\] \(per tensor\), "
                                                    r"\[heads_kv\] = \[2\] .* got torch.float16 \[2\]"):
        fgt.attention_with_kvcache(q, k8, k8, k_scale=_meta(2, dtype=torch.float16))
    for shape in ((3,), (2, 1), (1, 2, 1)):
        with pytest.raises(FlashgenArgumentError, match=r"v_scale must be float32 of shape"):
            fgt.attention_with_kvcache(q, k8, k8, v_scale=_meta(*shape, dtype=torch.float32))
    with pytest.raises(FlashgenArgumentError, match=r"k_scale must be on meta \(q's device\), got cpu"):
        fgt.attention_with_kvcache(q, k8, k8, k_scale=torch.ones(()))
    with pytest.raises(FlashgenArgumentError, match="k_scale must be a torch.Tensor or None, got float"):
        fgt.attention_with_kvcache(q, k8, k8, k_scale=0.5)
    with pytest.raises(FlashgenArgumentError, match="k_cache.dtype is torch.float32; flashgen runs torch.float16 and "
                                                    "torch.bfloat16 \\(a KV cache also torch.float8_e4m3fn"):
        fgt.attention_with_kvcache(q, _meta(2, 64, 2, 128, dtype=torch.float32), k8)
    with pytest.raises(FlashgenArgumentError, match="q.dtype is torch.float8_e4m3fn; flashgen runs"):
        fgt.attention_with_kvcache(_meta(2, 1, 8, 128, dtype=E4M3), k8, k8)
    with pytest.raises(FlashgenArgumentError, match="k.dtype is torch.float8_e4m3fn"):  # new tokens: q's dtype
        fgt.attention_with_kvcache(q, k8, k8, _meta(2, 1, 2, 128, dtype=E4M3), _meta(2, 1, 2, 128, dtype=E4M3),
                                   cache_seqlens=torch.zeros(2, dtype=torch.int32, device="meta"))


_gpu_missing = testsupport.gpu_missing()
gpu = pytest.mark.skipif(_gpu_missing is not None, reason=f"GPU tests skipped: {_gpu_missing}")
_fp8_missing = _gpu_missing
if _fp8_missing is None and torch.cuda.get_device_capability() < (8, 9):
    _fp8_missing = f"{torch.cuda.get_device_name()} is older than sm_89 (FP8 conversions)"
fp8_gpu = pytest.mark.skipif(_fp8_missing is not None, reason=f"FP8 cache tests skipped: {_fp8_missing}")


def _randn(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=generator).to(dtype)


def _scales(kind, fp8, batch, heads_kv, seed):
    """A cache's scale of each kind, about 4 / the format's largest value (randn's tail saturates): one for the
    tensor ([] or [1]), per kv head, or per (sequence, kv head) from a transposed tensor (its own strides)."""
    base = 4.0 / _FP8_MAX[fp8]
    spread = 1.0 + 0.5 * torch.rand(heads_kv, batch, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    if kind == "tensor":
        return torch.tensor(base * 1.25, device="cuda") if seed % 2 else torch.full((1,), base * 1.25, device="cuda")
    if kind == "head":
        return (base * spread[:, 0]).contiguous()
    return (base * spread).t()  # [batch, heads_kv], strides (1, batch)


def _per_row(scale, batch, heads_kv):
    """scale as [batch, 1, heads_kv, 1] float32: the factor of sequence b's rows of kv head h."""
    return scale.expand(batch, heads_kv)[:, None, :, None].float()


def _quantized(x, scale, fp8):
    """x [batch, rows, heads_kv, head_dim] as the library stores it in an FP8 cache: x / scale (fp32, rounded to
    nearest) rounded to the nearest FP8 value, saturated. torch's cast does not saturate (past the largest value e4m3fn
    gives NaN, e5m2 inf), so the quotient is clamped first."""
    limit = _FP8_MAX[fp8]
    return (x.float() / _per_row(scale, x.shape[0], x.shape[2])).clamp(-limit, limit).to(fp8)


def _paged(logical, page_size):
    """(block_table, cache): an FP8 cache [batch, capacity, heads_kv, head_dim] moved into pages laid out in reverse
    order (moved as bytes: indexing takes uint8, not every torch has it for FP8)."""
    table, pages, _ = testsupport.reversed_pages(logical.view(torch.uint8), logical.view(torch.uint8), page_size)
    return table, pages.view(logical.dtype)


def _logical(cache, table, capacity):
    """The cache as [batch, capacity, heads_kv, head_dim] through its block table (None: contiguous)."""
    if table is None:
        return cache
    rows = cache.view(torch.uint8)[table.flatten().long()]
    return rows.reshape(table.shape[0], capacity, *cache.shape[2:]).view(cache.dtype)


@fp8_gpu
@pytest.mark.parametrize("kind", ["tensor", "head", "sequence_head"])
@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("fp8,dtype,head_dim", [(E4M3, torch.bfloat16, 128), (E5M2, torch.float16, 64)],
                         ids=["e4m3-bf16", "e5m2-fp16"])
def test_decode_over_an_fp8_cache_matches_reference_with_append(fp8, dtype, head_dim, page_size, kind):
    batch, capacity, hq, hkv, new = 3, 256, 8, 2, 2
    d = head_dim
    lens = [100, 0, 254 - new]
    k_scale, v_scale = _scales(kind, fp8, batch, hkv, seed=1), _scales(kind, fp8, batch, hkv, seed=2)
    k_logical = _quantized(_randn(batch, capacity, hkv, d, seed=3), k_scale, fp8)
    v_logical = _quantized(_randn(batch, capacity, hkv, d, seed=4), v_scale, fp8)
    k_new, v_new = _randn(batch, new, hkv, d, dtype=dtype, seed=5), _randn(batch, new, hkv, d, dtype=dtype, seed=6)
    k_new[0, 0, 0, :3], v_new[2, 1, 1, 5:7] = 20.0, -20.0  # past the largest FP8 value at any scale: saturated
    q = _randn(batch, new, hq, d, dtype=dtype, seed=7)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    table, k_cache, v_cache = None, k_logical.clone(), v_logical.clone()
    if page_size:
        (table, k_cache), (_, v_cache) = _paged(k_logical, page_size), _paged(v_logical, page_size)
    for num_splits in (0, 1, 3):  # each call appends the same rows again
        out, lse = fgt.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                              block_table=table, causal=True, num_splits=num_splits,
                                              return_softmax_lse=True, k_scale=k_scale, v_scale=v_scale)
        assert out.dtype == dtype and out.shape == q.shape and lse.shape == (batch, hq, new)
        k_now, v_now = _logical(k_cache, table, capacity), _logical(v_cache, table, capacity)
        k_want, v_want = _quantized(k_new, k_scale, fp8), _quantized(v_new, v_scale, fp8)
        for b, n in enumerate(lens):
            for name, now, want, before in (("k", k_now, k_want, k_logical), ("v", v_now, v_want, v_logical)):
                bits = now[b, n:n + new].view(torch.uint8)
                assert torch.equal(bits, want[b].view(torch.uint8)), (
                    f"{name} rows appended to sequence {b}: {int((bits != want[b].view(torch.uint8)).sum())} of "
                    f"{bits.numel()} differ from {name} / {name}_scale rounded and saturated")
                assert torch.equal(now[b, :n].view(torch.uint8), before[b, :n].view(torch.uint8))
        keys = k_now.float().double() * _per_row(k_scale, batch, hkv).double()
        values = v_now.float().double() * _per_row(v_scale, batch, hkv).double()
        for b, n in enumerate(lens):
            visible = testsupport.visible_keys(new, n + new, "bottom_right", q.device)
            qs = q[b:b + 1]
            want, want_lse, _ = testsupport.float64_bshd_attention(qs, keys[b:b + 1, :n + new],
                                                                   values[b:b + 1, :n + new], torch.zeros_like(qs),
                                                                   d ** -0.5, visible)
            testsupport.assert_close_to_float64(f"out of sequence {b}, num_splits {num_splits}", out[b:b + 1], want,
                                                dtype)
            assert testsupport.max_error(lse[b:b + 1], want_lse) <= 1e-3, f"lse of sequence {b}"


@fp8_gpu
def test_caches_of_one_layout_in_each_format_run_their_own_kernels():
    """Calls whose caches differ in their format alone (same shapes and element strides, no scales: 1) each run their
    format's kernels, one after another in one process, wherever the library keeps launches by problem class."""
    batch, capacity, hq, hkv, d = 2, 64, 4, 2, 64
    q = _randn(batch, 1, hq, d, dtype=torch.bfloat16, seed=40)
    keys, values = (_randn(batch, capacity, hkv, d, seed=s) for s in (41, 42))
    for fmt in (torch.bfloat16, E4M3, E5M2, torch.bfloat16, E4M3):
        k_cache, v_cache = keys.to(fmt), values.to(fmt)
        out = fgt.attention_with_kvcache(q, k_cache, v_cache, num_splits=1)
        want, *_ = testsupport.float64_bshd_attention(q, k_cache.float(), v_cache.float(), torch.zeros_like(q),
                                                      d ** -0.5)
        testsupport.assert_close_to_float64(f"out over a {fmt} cache", out, want, torch.bfloat16)


@fp8_gpu
def test_warm_calls_and_graph_replays_read_each_calls_scales(monkeypatch):
    """A second call of a signature goes through its plan with its own scale tensors (bitwise a cold call's); a CUDA
    graph reads the scales on the device, so a replay after they changed in place gives the new scales' output."""
    batch, capacity, hq, hkv, d = 2, 128, 4, 2, 128
    lens = torch.tensor([77, 128], dtype=torch.int32, device="cuda")
    q = _randn(batch, 1, hq, d, dtype=torch.bfloat16, seed=10)
    k_cache, v_cache = (_randn(batch, capacity, hkv, d, seed=s).to(E4M3) for s in (11, 12))

    def call(k_scale, v_scale):
        return fgt.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, num_splits=2, k_scale=k_scale,
                                          v_scale=v_scale)

    first = (torch.full((batch, hkv), 0.5, device="cuda"), torch.full((batch, hkv), 2.0, device="cuda"))
    second = (torch.rand(batch, hkv, device="cuda") + 0.1, torch.rand(batch, hkv, device="cuda") + 0.1)
    call(*first)
    checked = []
    real_check = fg_kvcache._check_kvcache_inputs
    monkeypatch.setattr(fg_kvcache, "_check_kvcache_inputs", lambda *a: checked.append(1) or real_check(*a))
    warm = call(*second)
    assert not checked, "the warm call took the checked path, not its plan"
    fg_calls._plans.kvcache.clear()
    assert torch.equal(warm, call(*second)) and checked
    assert not torch.equal(warm, call(*first))

    scales = tuple(t.clone() for t in first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(*scales)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = call(*scales)
    for scale, new_value in zip(scales, second):
        scale.copy_(new_value)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, warm)


@fp8_gpu
def test_torch_compile_keeps_an_fp8_cache_call_in_its_graph():
    """Under torch.compile(fullgraph=True) the call is the op flashgen::attention_kvcache with its scales: out and the
    caches the new tokens were appended to equal eager's bit for bit."""
    torch._dynamo.reset()
    batch, capacity, hq, hkv, d, new = 2, 128, 8, 2, 64, 1
    q, k_new, v_new = (_randn(batch, new, heads, d, dtype=torch.bfloat16, seed=s)
                       for heads, s in ((hq, 20), (hkv, 21), (hkv, 22)))
    k_cache, v_cache = (_randn(batch, capacity, hkv, d, seed=s).to(E5M2) for s in (23, 24))
    lens = torch.tensor([5, 100], dtype=torch.int32, device="cuda")
    k_scale, v_scale = torch.tensor([0.75, 1.5], device="cuda"), torch.tensor(1.25, device="cuda")

    def step(k_cache, v_cache):
        return fgt.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True,
                                          num_splits=2, k_scale=k_scale, v_scale=v_scale)

    eager_caches = (k_cache.clone(), v_cache.clone())
    eager = step(*eager_caches)
    compiled_caches = (k_cache.clone(), v_cache.clone())
    compiled = torch.compile(step, fullgraph=True)(*compiled_caches)
    assert torch.equal(compiled, eager)
    for got, want in zip(compiled_caches, eager_caches):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(eager_caches[0].view(torch.uint8), k_cache.view(torch.uint8))  # the new token was appended


@gpu
def test_mixed_formats_and_misplaced_scales_are_refused():
    q = _randn(2, 1, 8, 64, dtype=torch.bfloat16, seed=30)
    k_cache, v_cache = (_randn(2, 64, 2, 64, seed=s).to(E4M3) for s in (31, 32))
    with pytest.raises(FlashgenArgumentError, match="share one format"):
        fgt.attention_with_kvcache(q, k_cache, v_cache.view(torch.uint8).view(E5M2))
    with pytest.raises(FlashgenArgumentError, match=r"k_scale must be on cuda:\d \(q's device\), got cpu"):
        fgt.attention_with_kvcache(q, k_cache, v_cache, k_scale=torch.ones(2))
    # The op itself, as torch.compile's graphs call it, checks them too (in C++ or in Python).
    with pytest.raises(RuntimeError, match="k_scale must be float32 of shape"):
        torch.ops.flashgen.attention_kvcache(q, k_cache, v_cache, None, None, None, None, 0.0, "none", 0, -1, -1, None,
                                             0, 0.0, None, torch.ones(3, device="cuda"), None)
