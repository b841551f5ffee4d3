"""flashgen.torch.varlen_attention over FP8 q, k and v (torch.float8_e4m3fn, torch.float8_e5m2) with FlashAttention-3's
q_descale, k_descale and v_descale, per (sequence, kv head), and a bf16 or fp16 out_dtype; forward only. On any machine
with torch: the outputs' dtypes and shapes through the fake kernel, and the refusals, each named, through meta tensors
(inputs that require grad, mixed formats, descales with 16-bit inputs or not of [batch, heads_kv] with batch the
sequences). On a GPU: the same refusals of real tensors. On sm_90: each sequence's rows of out and lse
against float64 attention over that sequence's dequantized inputs (codes.double() * descale[b, kv head]) by
FlashAttention-3's rule, test_torch_fp8_forward.py's helpers (an empty sequence, one with no key, more keys than
queries and rows that see no key; causal both alignments and not; GQA; d64 and d128; both formats and output dtypes);
equal-length sequences against the dense FP8 call over the same data; a 0-dim, an expanded (zero strides) and a
per-kv-head descale; the keys and values in a shuffled paged cache (block_table); and torch.compile's graph.
"""

import pytest

import testsupport

_missing = testsupport.torch_missing()
if _missing:
    pytest.skip(f"flashgen.torch tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import FlashgenArgumentError  # noqa: E402

# The dense FP8 tests' codes, descales, float64 reference, FlashAttention-3's rule and GPU marks (helpers only: no
# test_ name is imported, so pytest does not collect the dense tests twice).
from test_torch_fp8_forward import E4M3, E5M2, _check_fa3_rule, _codes, _descale, _reference, gpu, sm90  # noqa: E402

_offsets = testsupport.packed_offsets


def _meta(*shape, dtype=E4M3):
    return torch.empty(shape, device="meta", dtype=dtype)


def _meta_offsets(batch):
    return torch.empty(batch + 1, device="meta", dtype=torch.int32)


def test_fp8_outputs_take_out_dtype_and_refusals_are_named_through_meta_tensors():
    batch, total_q, total_k, heads_q, heads_kv, head_dim = 3, 200, 300, 4, 2, 128
    q, k = _meta(total_q, heads_q, head_dim), _meta(total_k, heads_kv, head_dim)
    cu_q, cu_k = _meta_offsets(batch), _meta_offsets(batch)
    per_entry = _meta(batch, heads_kv, dtype=torch.float32)
    out, lse, probs = fgt.varlen_attention(q, k, k, cu_q, cu_k, 100, 150, causal=True, return_attn_probs=True,
                                           q_descale=per_entry, k_descale=per_entry, v_descale=per_entry)
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == torch.bfloat16  # FlashAttention-3's
    assert probs is None and lse.shape == (heads_q, total_q) and lse.dtype == torch.float32
    assert fgt.varlen_attention(q, k, k, cu_q, cu_k, 100, 150, out_dtype=torch.float16).dtype == torch.float16
    # Descales that broadcast to [batch, heads_kv] (batch: the sequences): an expanded scalar, the scalar, [heads_kv].
    scalar = _meta(dtype=torch.float32)
    for descale in (scalar.expand(batch, heads_kv), scalar, _meta(heads_kv, dtype=torch.float32)):
        assert fgt.varlen_attention(q, k, k, cu_q, cu_k, 100, 150, q_descale=descale, k_descale=descale,
                                    v_descale=descale).shape == q.shape
    # Not of [batch (the sequences), heads_kv]: [batch + 1, heads_kv] (the offsets' length) is refused by name.
    with pytest.raises(FlashgenArgumentError, match=r"k_descale must be float32 of shape \[batch, heads_kv\] = "
                                                    r"\[3, 2\]"):
        fgt.varlen_attention(q, k, k, cu_q, cu_k, 100, 150, k_descale=_meta(batch + 1, heads_kv, dtype=torch.float32))
    # Descales with 16-bit q, k and v.
    q16, k16 = _meta(total_q, heads_q, head_dim, dtype=torch.bfloat16), _meta(total_k, heads_kv, head_dim,
                                                                               dtype=torch.bfloat16)
    with pytest.raises(FlashgenArgumentError, match=r"q_descale: given for 16-bit q, k and v"):
        fgt.varlen_attention(q16, k16, k16, cu_q, cu_k, 100, 150, q_descale=per_entry)
    # One format for q, k and v.
    with pytest.raises(FlashgenArgumentError, match=r"k.dtype is torch.float8_e5m2 but q.dtype is "
                                                    r"torch.float8_e4m3fn \(FP8 q, k and v share one format\)"):
        fgt.varlen_attention(q, _meta(total_k, heads_kv, head_dim, dtype=E5M2), k, cu_q, cu_k, 100, 150)
    # Forward only: inputs that would record autograd are refused, each named; under no_grad they run.
    for name in ("q", "k", "v"):
        inputs = {"q": q, "k": k, "v": k}
        inputs[name] = inputs[name].clone().requires_grad_()
        with pytest.raises(FlashgenArgumentError, match=rf"flashgen.torch.varlen_attention: {name} requires grad, but "
                                                        r"the FP8 forward has no backward"):
            fgt.varlen_attention(inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, 100, 150)
        with torch.no_grad():
            assert not fgt.varlen_attention(inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, 100,
                                            150).requires_grad
    sinks = _meta(heads_q, dtype=torch.float32).requires_grad_()
    with pytest.raises(FlashgenArgumentError, match="sinks requires grad, but the FP8 forward has no backward"):
        fgt.varlen_attention(q, k, k, cu_q, cu_k, 100, 150, sinks=sinks)
    # The op itself refuses to record autograd too (its C++ autograd, or the Python formula's context).
    with pytest.raises(RuntimeError, match="the FP8 forward has no backward"):
        torch.ops.flashgen.varlen_attention_forward(q.clone().requires_grad_(), k, k, cu_q, cu_k, None, 100, 150,
                                                    0.0, "none", False)


def _packed_codes(lens, heads, head_dim, fmt, width, seed):
    """FP8 codes [sum(lens), heads, head_dim] of about N(0, width) on the GPU (test_torch_fp8_forward's _codes)."""
    return _codes((sum(lens), heads, head_dim), fmt, width, seed)


def _sequence_descales(descales, b, batch, heads_kv):
    """Sequence b's descales as _reference takes them for a batch of one: [1, heads_kv] (None stays None)."""
    return tuple(None if d is None else d.expand(batch, heads_kv)[b:b + 1] for d in descales)


def _check_each_sequence(name, out, lse, q, k, v, q_lens, k_lens, descales, mask, out_dtype):
    """Each sequence's rows of the packed out and lse ([heads_q, total_q]) against _reference of that sequence alone
    (its codes and its own row of each descale) by FlashAttention-3's rule; a sequence with no key: out 0, lse -inf."""
    batch, heads_q, heads_kv = len(q_lens), q.shape[1], k.shape[1]
    assert out.dtype == out_dtype and out.shape == (q.shape[0], heads_q, v.shape[2]), f"{name}: out {out.dtype}"
    assert lse.dtype == torch.float32 and lse.shape == (heads_q, q.shape[0]), f"{name}: lse {tuple(lse.shape)}"
    assert out.grad_fn is None and not out.requires_grad
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(q_lens, k_lens)):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        q0, k0 = q0 + sq, k0 + sk
        if sq == 0:
            continue
        got, got_lse = out[rows][None], lse[:, rows][None]  # bshd [1, sq, heads_q, d], [1, heads_q, sq]
        label = f"{name}, sequence {b} ({sq} queries, {sk} keys)"
        if sk == 0:
            assert torch.equal(got, torch.zeros_like(got)), f"{label}: rows that see no key must give out 0"
            assert bool(torch.isneginf(got_lse).all()), f"{label}: rows that see no key must give lse -inf"
            continue
        reference = _reference(q[None, rows], k[None, keys], v[None, keys],
                               _sequence_descales(descales, b, batch, heads_kv), mask)
        _check_fa3_rule(label, got, got_lse, reference, out_dtype)


# Sequences of lengths off the 32-row steps: an empty one (0 queries, 33 keys), more keys than queries, more queries
# than keys (rows that see no key under bottom-right causal), and one with no key at all.
_Q_LENS = [70, 0, 129, 3, 50, 6]
_K_LENS = [70, 33, 200, 97, 20, 0]


# (format, out_dtype (None: the default, bf16), head_dim, mask)
_CASES = [
    pytest.param(E4M3, None, 128, "bottom_right", id="e4m3-d128-causal-bf16"),
    pytest.param(E4M3, torch.float16, 64, "none", id="e4m3-d64-nomask-fp16"),
    pytest.param(E5M2, torch.bfloat16, 128, "top_left", id="e5m2-d128-top-left-bf16"),
    pytest.param(E5M2, torch.float16, 64, "bottom_right", id="e5m2-d64-causal-fp16"),
]


@sm90
@pytest.mark.parametrize("fmt,out_dtype,head_dim,mask", _CASES)
def test_each_fp8_sequence_matches_float64_by_flash_attention_3s_rule(fmt, out_dtype, head_dim, mask):
    heads_q, heads_kv, width = 4, 2, 150.0
    batch = len(_Q_LENS)
    q = _packed_codes(_Q_LENS, heads_q, head_dim, fmt, width, seed=1)
    k = _packed_codes(_K_LENS, heads_kv, head_dim, fmt, width, seed=2)
    v = _packed_codes(_K_LENS, heads_kv, head_dim, fmt, width, seed=3)
    # Per (sequence, kv head), each entry its own value, from a transposed tensor (strides of its own).
    descales = tuple(_descale("entry", batch, heads_kv, width, which) for which in range(3))
    out, lse, probs = fgt.varlen_attention(
        q, k, v, _offsets(_Q_LENS), _offsets(_K_LENS), max(_Q_LENS), max(_K_LENS), causal=mask != "none",
        causal_align="top_left" if mask == "top_left" else "bottom_right", return_attn_probs=True,
        q_descale=descales[0], k_descale=descales[1], v_descale=descales[2], out_dtype=out_dtype)
    assert probs is None
    _check_each_sequence(f"{fmt} d{head_dim} {mask}", out, lse, q, k, v, _Q_LENS, _K_LENS, descales, mask,
                         out_dtype or torch.bfloat16)


@sm90
@pytest.mark.parametrize("fmt,out_dtype,head_dim,mask", [
    pytest.param(E4M3, None, 128, "bottom_right", id="e4m3-d128-causal-bf16"),
    pytest.param(E5M2, torch.float16, 64, "none", id="e5m2-d64-nomask-fp16"),
])
def test_equal_length_sequences_match_the_dense_fp8_call(fmt, out_dtype, head_dim, mask):
    """Sequences of one length packed give what attention() gives over the same codes as [batch, seqlen, heads, d]
    with the same per-(batch entry, kv head) descales: the same tiles of 128 keys, so equal up to last-bit roundings."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, width = 3, 150, 200, 4, 2, 150.0
    q = _codes((batch, seqlen_q, heads_q, head_dim), fmt, width, seed=10)
    k = _codes((batch, seqlen_k, heads_kv, head_dim), fmt, width, seed=11)
    v = _codes((batch, seqlen_k, heads_kv, head_dim), fmt, width, seed=12)
    descales = tuple(_descale("entry", batch, heads_kv, width, which) for which in range(3))
    kwargs = dict(causal=mask != "none", q_descale=descales[0], k_descale=descales[1], v_descale=descales[2],
                  out_dtype=out_dtype)
    dense, dense_lse = fgt.attention(q, k, v, return_lse=True, **kwargs)
    packed, packed_lse, _ = fgt.varlen_attention(
        q.reshape(batch * seqlen_q, heads_q, head_dim), k.reshape(batch * seqlen_k, heads_kv, head_dim),
        v.reshape(batch * seqlen_k, heads_kv, head_dim), _offsets([seqlen_q] * batch), _offsets([seqlen_k] * batch),
        seqlen_q, seqlen_k, return_attn_probs=True, **kwargs)
    out_dtype = out_dtype or torch.bfloat16
    assert packed.dtype == dense.dtype == out_dtype
    packed = packed.view(batch, seqlen_q, heads_q, head_dim)
    packed_lse = packed_lse.view(heads_q, batch, seqlen_q).transpose(0, 1)  # as dense's [batch, heads_q, seqlen_q]
    ulp = dense.abs().max().item() * (2.0 ** -7 if out_dtype == torch.bfloat16 else 2.0 ** -10)
    allowed = 2 * ulp  # the same arithmetic per row; not asked to be bitwise
    assert testsupport.max_error(packed, dense) <= allowed, testsupport.mismatch_report("packed out", packed, dense,
                                                                                          allowed)
    live = torch.isfinite(dense_lse)
    assert torch.equal(torch.isfinite(packed_lse), live)
    assert testsupport.max_error(packed_lse[live], dense_lse[live]) <= 1e-4
    reference = _reference(q, k, v, descales, mask)
    _check_fa3_rule(f"packed {fmt} {mask}", packed, packed_lse, reference, out_dtype)


@sm90
def test_scalar_descales_and_fp16_out():
    """q_descale a 0-dim tensor, k_descale a scalar expanded to [batch, heads_kv] with zero strides (as vLLM passes
    one), v_descale one per kv head; out_dtype=torch.float16 gives fp16 out, each sequence right by FA3's rule."""
    heads_q, heads_kv, head_dim, width = 4, 2, 128, 150.0
    q_lens, k_lens = [45, 0, 130, 7], [45, 10, 161, 90]
    batch = len(q_lens)
    q = _packed_codes(q_lens, heads_q, head_dim, E4M3, width, seed=20)
    k = _packed_codes(k_lens, heads_kv, head_dim, E4M3, width, seed=21)
    v = _packed_codes(k_lens, heads_kv, head_dim, E4M3, width, seed=22)
    q_descale = torch.tensor(1.2 / width, device="cuda")
    k_descale = _descale("scalar", batch, heads_kv, width, 1)
    v_descale = _descale("head", batch, heads_kv, width, 2)
    assert q_descale.dim() == 0 and k_descale.shape == (batch, heads_kv) and k_descale.stride() == (0, 0)
    assert v_descale.shape == (heads_kv,)
    descales = (q_descale, k_descale, v_descale)
    out, lse, _ = fgt.varlen_attention(q, k, v, _offsets(q_lens), _offsets(k_lens), max(q_lens), max(k_lens),
                                       causal=True, return_attn_probs=True, q_descale=q_descale,
                                       k_descale=k_descale, v_descale=v_descale, out_dtype=torch.float16)
    assert out.dtype == torch.float16
    _check_each_sequence("scalar descales, fp16", out, lse, q, k, v, q_lens, k_lens, descales, "bottom_right",
                         torch.float16)


@sm90
def test_torch_compile_keeps_an_fp8_varlen_call_in_its_graph():
    """Under torch.compile(fullgraph=True) the call is the op flashgen::varlen_attention_forward with its descales (a
    scalar expanded with zero strides as vLLM passes q_descale, per-(sequence, kv head) ones for k and v) and out_dtype:
    out (fp16) and lse equal eager's bit for bit."""
    torch._dynamo.reset()
    heads_q, heads_kv, head_dim, width = 8, 2, 128, 150.0
    q_lens, k_lens = [100, 0, 37], [100, 20, 250]
    batch = len(q_lens)
    q = _packed_codes(q_lens, heads_q, head_dim, E4M3, width, seed=40)
    k = _packed_codes(k_lens, heads_kv, head_dim, E4M3, width, seed=41)
    v = _packed_codes(k_lens, heads_kv, head_dim, E4M3, width, seed=42)
    cu_q, cu_k = _offsets(q_lens), _offsets(k_lens)
    q_descale = _descale("scalar", batch, heads_kv, width, 0)
    k_descale, v_descale = (_descale("entry", batch, heads_kv, width, which) for which in (1, 2))

    def step(q, k, v, cu_q, cu_k):
        out, lse, _ = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True,
                                           return_attn_probs=True, q_descale=q_descale, k_descale=k_descale,
                                           v_descale=v_descale, out_dtype=torch.float16)
        return out, lse

    eager = step(q, k, v, cu_q, cu_k)
    compiled = torch.compile(step, fullgraph=True)(q, k, v, cu_q, cu_k)
    assert compiled[0].dtype == torch.float16 and compiled[1].dtype == torch.float32
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    _check_each_sequence("compiled", *compiled, q, k, v, q_lens, k_lens, (q_descale, k_descale, v_descale),
                         "bottom_right", torch.float16)


@gpu
def test_gpu_refusals_name_the_argument():
    heads, head_dim = 2, 64
    lens = [40, 24]
    q8 = _packed_codes(lens, heads, head_dim, E4M3, 10.0, seed=60)
    cu = _offsets(lens)
    with pytest.raises(FlashgenArgumentError, match=r"k.dtype is torch.float8_e5m2 but q.dtype is "
                                                    r"torch.float8_e4m3fn \(FP8 q, k and v share one format\)"):
        fgt.varlen_attention(q8, q8.view(torch.uint8).view(E5M2), q8, cu, cu, max(lens), max(lens))
    qg = q8.clone().requires_grad_()
    with pytest.raises(FlashgenArgumentError, match="q requires grad, but the FP8 forward has no backward"):
        fgt.varlen_attention(qg, q8, q8, cu, cu, max(lens), max(lens), causal=True)


@sm90
def test_a_paged_cache_gives_what_the_packed_keys_give():
    """The same sequences with their keys and values in shuffled pages of 16 rows (the pages' other rows random
    codes): each sequence against float64 by FlashAttention-3's rule, and equal to the packed call's rows."""
    heads_q, heads_kv, head_dim, width, page = 4, 2, 128, 150.0, 16
    batch = len(_Q_LENS)
    q = _packed_codes(_Q_LENS, heads_q, head_dim, E4M3, width, seed=70)
    k = _packed_codes(_K_LENS, heads_kv, head_dim, E4M3, width, seed=71)
    v = _packed_codes(_K_LENS, heads_kv, head_dim, E4M3, width, seed=72)
    descales = tuple(_descale("entry", batch, heads_kv, width, which) for which in range(3))
    max_pages = (max(_K_LENS) + page - 1) // page
    generator = torch.Generator(device="cpu").manual_seed(73)
    order = torch.randperm(batch * max_pages + 3, generator=generator).to("cuda")
    table = order[:batch * max_pages].view(batch, max_pages).to(torch.int32)
    k_cache = _codes((order.numel(), page, heads_kv, head_dim), E4M3, width, seed=74)
    v_cache = _codes((order.numel(), page, heads_kv, head_dim), E4M3, width, seed=75)
    testsupport.fill_pages((k_cache, v_cache), (k, v), _K_LENS, table, page)
    cu_q, cu_k = _offsets(_Q_LENS), _offsets(_K_LENS)
    kwargs = dict(causal=True, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                  v_descale=descales[2])
    packed, packed_lse, _ = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(_Q_LENS), max(_K_LENS), **kwargs)
    out, lse, _ = fgt.varlen_attention(q, k_cache, v_cache, cu_q, cu_k, max(_Q_LENS), max(_K_LENS),
                                       block_table=table, **kwargs)
    _check_each_sequence("paged e4m3 d128 causal", out, lse, q, k, v, _Q_LENS, _K_LENS, descales, "bottom_right",
                         torch.bfloat16)
    # The same tiles over the same Vᵀ: equal up to last-bit roundings.
    assert (out.float() - packed.float()).abs().max() <= 1e-2 * packed.float().abs().max()
    live = torch.isfinite(packed_lse)
    assert torch.equal(torch.isfinite(lse), live) and (lse[live] - packed_lse[live]).abs().max() <= 1e-4
