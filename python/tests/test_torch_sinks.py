"""flashgen.torch's sinks argument (gpt-oss's attention sinks): on any machine with torch, the sinks refused by name,
the ops' schemas and fake kernels (meta tensors, the sinks' gradient in their own dtype, the ops' old positional
calls); on the GPU, attention(), varlen_attention() and attention_with_kvcache() outputs, lse and gradients (dsinks
included) against a float64 reference that takes each row's softmax over its scores and its head's sink and drops
the sink's column, explain() naming the sinks' gradient kernel, torch.compile and torch.library.opcheck.
"""

import math

import pytest

import testsupport

_missing = testsupport.torch_missing()
if _missing:
    pytest.skip(f"flashgen.torch tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("sinks,match", [
    (lambda: _meta(3, dtype=torch.float32), r"sinks must be float32 .*\[heads_q\] = \[2\], got torch.float32 \[3\]"),
    (lambda: _meta(1, 2, dtype=torch.float32), r"sinks must be float32 .*got torch.float32 \[1, 2\]"),
    (lambda: _meta(2, dtype=torch.float64), "sinks must be float32 .*got torch.float64"),
    (lambda: torch.zeros(2, dtype=torch.int32, device="meta"), "sinks must be float32 .*got torch.int32"),
    (lambda: torch.zeros(2), r"sinks must be on meta \(q's device\), got cpu"),
    (lambda: [0.5, 0.25], "sinks must be a torch.Tensor or None, got list"),
])
def test_bad_sinks_are_refused_naming_them(sinks, match):
    q, packed = _meta(1, 16, 2, 64), _meta(16, 2, 64)
    cu = torch.tensor([0, 16], dtype=torch.int32, device="meta")
    for call in (lambda: fgt.attention(q, q, q, sinks=sinks()),
                 lambda: fgt.varlen_attention(packed, packed, packed, cu, cu, 16, 16, sinks=sinks()),
                 lambda: fgt.attention_with_kvcache(q, q, q, sinks=sinks())):
        with pytest.raises(flashgen.FlashgenArgumentError, match=match) as caught:
            call()
        assert caught.value.status == flashgen._lib.ERROR_INVALID_ARGUMENT


def test_meta_tensors_take_sinks_through_the_ops_and_their_gradient_flows_back():
    q, k = _meta(2, 128, 4, 64).requires_grad_(True), _meta(2, 96, 2, 64).requires_grad_(True)
    # gpt-oss's sinks parameter is bfloat16: converted for the kernels, its gradient comes back as bfloat16.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        sinks = _meta(4, dtype=dtype).requires_grad_(True)
        out, lse = fgt.attention(q, k, k, causal=True, sinks=sinks, return_lse=True)
        assert out.shape == q.shape and lse.shape == (2, 4, 128) and lse.dtype == torch.float32
        out.sum().backward()
        assert sinks.grad is not None and sinks.grad.shape == (4,) and sinks.grad.dtype == dtype
    # A strided sinks tensor is taken (made contiguous), and sinks alone can need the gradient.
    strided = _meta(8, dtype=torch.float32).requires_grad_(True)
    fgt.attention(q.detach(), k.detach(), k.detach(), sinks=strided[::2]).sum().backward()
    assert strided.grad.shape == (8,)
    packed, kv = _meta(300, 4, 64).requires_grad_(True), _meta(300, 2, 64).requires_grad_(True)
    cu = torch.tensor([0, 100, 100, 300], dtype=torch.int32, device="meta")
    sinks = _meta(4, dtype=torch.float32).requires_grad_(True)
    out = fgt.varlen_attention(packed, kv, kv, cu, cu, 200, 200, causal=True, sinks=sinks)
    assert out.shape == packed.shape
    out.sum().backward()
    assert sinks.grad.shape == (4,) and sinks.grad.dtype == torch.float32


def test_the_ops_keep_their_old_positional_calls_and_return_dsinks():
    q, k = _meta(1, 64, 4, 64), _meta(1, 80, 2, 64)
    out, lse = torch.ops.flashgen.attention_forward(q, k, k, 0.0, "bottom_right", "bshd", True)
    dq, dk, dv, dsinks = torch.ops.flashgen.attention_backward(out, q, k, k, out, lse, 0.0, "bottom_right", "bshd",
                                                               True)
    assert dq.shape == q.shape and dk.shape == k.shape and dsinks.shape == (0,) and dsinks.dtype == torch.float32
    sinks = _meta(4, dtype=torch.float32)
    out, lse = torch.ops.flashgen.attention_forward(q, k, k, 0.0, "none", "bshd", False, 0.0, -1, -1, None, sinks)
    *_, dsinks = torch.ops.flashgen.attention_backward(out, q, k, k, out, lse, 0.0, "none", "bshd", False, 0.0, -1,
                                                       -1, None, sinks)
    assert dsinks.shape == (4,) and dsinks.dtype == torch.float32
    packed, kv = _meta(100, 4, 64), _meta(120, 2, 64)
    cu_q, cu_k = (torch.tensor([0, n], dtype=torch.int32, device="meta") for n in (100, 120))
    out, lse = torch.ops.flashgen.varlen_attention_forward(packed, kv, kv, cu_q, cu_k, None, 100, 120, 0.0, "none",
                                                           False)
    *_, dsinks = torch.ops.flashgen.varlen_attention_backward(out, packed, kv, kv, out, lse, cu_q, cu_k, 100, 120,
                                                              0.0, "none", False)
    assert dsinks.shape == (0,)
    *_, dsinks = torch.ops.flashgen.varlen_attention_backward(out, packed, kv, kv, out, lse, cu_q, cu_k, 100, 120,
                                                              0.0, "none", False, 0.0, -1, -1, None, sinks)
    assert dsinks.shape == (4,) and dsinks.dtype == torch.float32


def test_the_kvcache_call_takes_sinks_through_its_op_without_an_autograd_node():
    q, cache = _meta(2, 1, 8, 64), _meta(2, 512, 2, 64)
    sinks = _meta(8, dtype=torch.bfloat16).requires_grad_(True)  # a model's parameter: read detached
    out, lse = fgt.attention_with_kvcache(q, cache, cache, cache_seqlens=300, sinks=sinks, num_splits=4,
                                          return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 1) and not out.requires_grad


# ---------------------------------------------------------------------------------------------------------
# On the GPU.

def _gpu():
    missing = testsupport.gpu_missing()
    if missing:
        pytest.skip(f"GPU tests skipped: {missing}")


_assert_close = testsupport.assert_close_to_float64
_SINKS = [2.0, 5.0, float("-inf"), 0.5]  # per query head; -inf: no sink on head 2


def _sink_reference(q, k, v, dout, scale, visible, sinks):
    """out, lse and (dq, dk, dv, dsinks) in float64 for bshd q, k, v (GQA by repeating k and v) with attention sinks
    ([heads_q]): each row's softmax over its visible scores ([seqlen_q, seqlen_k] bool) and its head's sink, the
    sink's column then dropped (it has no value). A row that sees no key gets out 0 and lse = sink; one whose logits
    are all -inf (no key, a -inf sink) out 0, lse -inf and no gradient. dout None: no gradients (None)."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    s64 = sinks.detach().double().requires_grad_(True)
    group = q.shape[2] // k.shape[2]
    kr, vr = (t.repeat_interleave(group, dim=2) for t in (k64, v64))
    scores = (torch.einsum("bqhd,bkhd->bhqk", q64, kr) * scale).masked_fill(~visible, float("-inf"))
    logits = torch.cat([scores, s64[None, :, None, None].expand(*scores.shape[:3], 1)], dim=-1)
    live = torch.isfinite(logits).any(dim=-1, keepdim=True)
    # A row of -inf logits takes finite ones, then weight 0: neither NaN nor a gradient comes out of it.
    logits = torch.where(live, logits, torch.zeros_like(logits))
    lse = torch.logsumexp(logits, dim=-1).masked_fill(~live[..., 0], float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", (torch.softmax(logits, dim=-1) * live)[..., :-1], vr)
    if dout is None:
        return out.detach(), lse.detach(), None
    out.backward(dout.double())
    grads = tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in (q64, k64, v64, s64))
    return out.detach(), lse.detach(), grads


def _assert_lse_close(got, want):
    """lse: -inf (a row of no key and no sink) in the same places, within 2e-3 elsewhere (a sink's own value on a
    row that sees no key)."""
    live = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), live)
    assert testsupport.max_error(got[live], want[live]) <= 2e-3, testsupport.mismatch_report(
        "lse", got[live], want[live], 2e-3)


@pytest.mark.parametrize("dtype,head_dim,seqlen_q,seqlen_k,causal_align,sinks_dtype", [
    (torch.bfloat16, 128, 190, 150, "bottom_right", torch.float32),  # rows 0..39 see no key: out 0, lse = sink
    (torch.float16, 64, 150, 190, None, torch.bfloat16),             # gpt-oss's bfloat16 sinks parameter
    (torch.bfloat16, 64, 150, 190, "top_left", torch.float32),
])
def test_attention_sinks_match_the_float64_reference(dtype, head_dim, seqlen_q, seqlen_k, causal_align, sinks_dtype):
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(head_dim + seqlen_q)
    q = torch.randn(2, seqlen_q, 4, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    k = torch.randn(2, seqlen_k, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    v = torch.randn(2, seqlen_k, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    dout = torch.randn(2, seqlen_q, 4, head_dim, device="cuda", generator=generator).to(dtype)
    sinks = torch.tensor(_SINKS, device="cuda", dtype=sinks_dtype, requires_grad=True)
    causal = causal_align is not None
    out, lse = fgt.attention(q, k, v, causal=causal, causal_align=causal_align or "bottom_right", sinks=sinks,
                             return_lse=True)
    out.backward(dout)
    visible = testsupport.visible_keys(seqlen_q, seqlen_k, causal_align or "none", q.device)
    want, want_lse, grads = _sink_reference(q, k, v, dout, 1 / math.sqrt(head_dim), visible, sinks)
    _assert_close("out", out, want, dtype)
    _assert_lse_close(lse, want_lse)
    for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
        _assert_close(name, tensor.grad, want_grad, dtype)
    assert sinks.grad.dtype == sinks_dtype
    _assert_close("dsinks", sinks.grad, grads[3], torch.bfloat16 if torch.bfloat16 in (dtype, sinks_dtype) else dtype)
    assert sinks.grad[2] == 0  # the -inf sink takes no share of any row
    # The sinks change the answer: head 1's lse without them differs by far more than the tolerance.
    _, plain_lse = fgt.attention(q.detach(), k.detach(), v.detach(), causal=causal,
                                 causal_align=causal_align or "bottom_right", return_lse=True)
    assert testsupport.max_error(plain_lse[:, 1], want_lse[:, 1]) > 0.05


def test_empty_keys_give_the_sinks_as_lse_and_zero_gradients():
    _gpu()
    q = torch.randn(2, 16, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(2, 0, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    sinks = torch.tensor(_SINKS, device="cuda", requires_grad=True)
    out, lse = fgt.attention(q, k, k, sinks=sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, sinks.detach()[None, :, None].expand(2, 4, 16))
    out.sum().backward()
    assert torch.equal(sinks.grad, torch.zeros_like(sinks)) and torch.equal(q.grad, torch.zeros_like(q))


def test_strided_sinks_are_read_as_their_values():
    _gpu()
    q = torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    strided = torch.tensor([1.0, 9.0, 3.0, 9.0, -1.0, 9.0, 0.0, 9.0], device="cuda")[::2]
    assert torch.equal(fgt.attention(q, q, q, sinks=strided), fgt.attention(q, q, q, sinks=strided.contiguous()))


def test_varlen_attention_sinks_match_each_sequence_empty_ones_included():
    _gpu()
    q_lens, k_lens = [3, 0, 130, 64, 9], [5, 20, 200, 40, 0]  # no query; rows 0..23 and all 9 rows see no key
    q, k, v, dout, cu_q, cu_k = testsupport.packed_gqa_batch(q_lens, k_lens, 31)
    sinks = torch.tensor(_SINKS, device="cuda", requires_grad=True)
    out, lse, _ = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True, sinks=sinks,
                                       return_attn_probs=True)
    out.backward(dout)
    want_dsinks = torch.zeros(4, dtype=torch.float64, device="cuda")
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(q_lens, k_lens)):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        if sq == 0:  # keys no query sees: zero dk and dv
            assert torch.equal(k.grad[keys], torch.zeros_like(k.grad[keys]))
            assert torch.equal(v.grad[keys], torch.zeros_like(v.grad[keys]))
        else:
            visible = testsupport.visible_keys(sq, sk, "bottom_right", q.device)
            want, want_lse, (dq, dk, dv, dsinks) = _sink_reference(q[None, rows], k[None, keys], v[None, keys],
                                                                   dout[None, rows], 1 / 8, visible, sinks)
            _assert_close(f"out of sequence {b}", out[None, rows], want, torch.bfloat16)
            _assert_lse_close(lse[:, rows], want_lse[0])
            _assert_close("dq", q.grad[None, rows], dq, torch.bfloat16)
            if sk > 0:
                _assert_close("dk", k.grad[None, keys], dk, torch.bfloat16)
                _assert_close("dv", v.grad[None, keys], dv, torch.bfloat16)
            want_dsinks += dsinks
        q0, k0 = q0 + sq, k0 + sk
    _assert_close("dsinks", sinks.grad, want_dsinks, torch.bfloat16)


def test_the_sinks_gradient_lies_within_fp32_rounding_of_the_float64_softmaxs():
    """dsinks is -Σ_i P_sink,i · Σ_j P_ij dP_ij summed in fp32 over the backward's own scores (the _dsink modules,
    which a call that wants the sinks' gradient runs), not -Σ_rows P_sink · rowsum(dO ∘ out) over the rounded out:
    within 5e-5 of the largest |dsink| of the float64 softmax's gradient, where the rounded out's formula lies 2e-4
    to 1.5e-3 away (bench/notes_variants.md, "The sinks' gradient's error"). A packed batch with an empty sequence
    and rows of no key, then a dense one."""
    _gpu()
    q_lens, k_lens = [3, 0, 130, 64, 9, 250], [5, 20, 200, 40, 0, 260]
    q, k, v, dout, cu_q, cu_k = testsupport.packed_gqa_batch(q_lens, k_lens, 43)
    sinks = torch.tensor(_SINKS, device="cuda", requires_grad=True)
    out, lse, _ = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True, sinks=sinks,
                                       return_attn_probs=True)
    out.backward(dout)
    want = torch.zeros(len(_SINKS), dtype=torch.float64, device="cuda")
    q0 = k0 = 0
    for sq, sk in zip(q_lens, k_lens):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        if sq > 0:
            visible = testsupport.visible_keys(sq, sk, "bottom_right", q.device)
            want += _sink_reference(q[None, rows], k[None, keys], v[None, keys], dout[None, rows], 1 / 8, visible,
                                    sinks)[2][3]
        q0, k0 = q0 + sq, k0 + sk
    assert (sinks.grad.double() - want).abs().max() <= 5e-5 * want.abs().max(), (sinks.grad, want)
    dense_q = q.detach()[None, :256].requires_grad_(True)
    dense_k = k.detach()[None, :200].requires_grad_(True)
    sinks.grad = None
    out = fgt.attention(dense_q, dense_k, dense_k, causal=True, sinks=sinks)
    out.backward(dout[None, :256])
    visible = testsupport.visible_keys(256, 200, "bottom_right", q.device)
    want = _sink_reference(dense_q, dense_k, dense_k, dout[None, :256], 1 / 8, visible, sinks)[2][3]
    assert (sinks.grad.double() - want).abs().max() <= 5e-5 * want.abs().max(), (sinks.grad, want)


@pytest.mark.parametrize("num_splits", [1, 4, 0])
def test_decode_with_sinks_matches_the_reference(num_splits):
    """A cache with no key (out 0, lse = sink), a short and a long one; the sink joins each row once however many
    key ranges are merged."""
    _gpu()
    batch, capacity, hq, hkv, d = 3, 1024, 8, 2, 128
    lens = [300, 0, 1000]
    generator = torch.Generator(device="cuda").manual_seed(41)
    k_cache, v_cache = (torch.randn(batch, capacity, hkv, d, device="cuda", generator=generator).to(torch.bfloat16)
                        for _ in range(2))
    q = torch.randn(batch, 1, hq, d, device="cuda", generator=generator).to(torch.bfloat16)
    sinks = torch.tensor(_SINKS * 2, device="cuda")
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = fgt.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, num_splits=num_splits,
                                          sinks=sinks, return_softmax_lse=True)
    for b, n in enumerate(lens):
        visible = torch.ones(1, n, dtype=torch.bool, device="cuda")
        want, want_lse, _ = _sink_reference(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], None, d ** -0.5,
                                            visible, sinks)
        _assert_close(f"out of sequence {b}, num_splits {num_splits}", out[b:b + 1], want, torch.bfloat16)
        _assert_lse_close(lse[b:b + 1], want_lse)


def test_explain_names_the_sinks_gradient_kernel():
    """explain() tells what this call runs: the sinks' gradient kernel with sinks only, whichever call of the problem
    class came first."""
    _gpu()
    q = torch.randn(1, 256, 4, 64, device="cuda", dtype=torch.float16)
    sinks = torch.tensor(_SINKS, device="cuda")
    symbols = [kernel["symbol"] for kernel in fgt.explain(q, q, q, sinks=sinks)["backward"]["kernels"]]
    assert symbols[-1].endswith("_sink_grad")
    plain = [kernel["symbol"] for kernel in fgt.explain(q, q, q)["backward"]["kernels"]]
    assert not any(symbol.endswith("_sink_grad") for symbol in plain)


def test_the_ops_with_sinks_pass_opcheck():
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(51)
    q, k, v = (torch.randn(1, n, h, 64, device="cuda", generator=generator).to(torch.float16).requires_grad_(True)
               for n, h in ((80, 4), (96, 2), (96, 2)))
    sinks = torch.tensor([1.0, 3.0, -0.5, 2.0], device="cuda", requires_grad=True)
    # deterministic: opcheck compares the outputs and gradients of several runs.
    torch.library.opcheck(torch.ops.flashgen.attention_forward.default,
                          (q, k, v, 0.0, "bottom_right", "bshd", True, 0.0, -1, -1, None, sinks))
    q, k, v, sinks = (t.detach() for t in (q, k, v, sinks))
    out, lse = torch.ops.flashgen.attention_forward(q, k, v, 0.0, "bottom_right", "bshd", True, 0.0, -1, -1, None,
                                                    sinks)
    torch.library.opcheck(torch.ops.flashgen.attention_backward.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.0, "bottom_right", "bshd", True, 0.0, -1, -1,
                           None, sinks))
    lens = torch.tensor([90, 7], dtype=torch.int32, device="cuda")
    cache = torch.randn(2, 128, 2, 64, device="cuda", generator=generator).to(torch.float16)
    torch.library.opcheck(torch.ops.flashgen.attention_kvcache.default,
                          (q[:, :1].expand(2, 1, 4, 64).contiguous(), cache, cache, None, None, lens, None, 0.0,
                           "bottom_right", 4, -1, -1, sinks))


def test_attention_sinks_under_torch_compile():
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(13)
    q, k, v = (torch.randn(1, 96, 2, 64, device="cuda", generator=generator).to(torch.float16).requires_grad_(True)
               for _ in range(3))
    sinks = torch.tensor([1.5, 3.0], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(lambda q, k, v, s: fgt.attention(q, k, v, causal=True, sinks=s, deterministic=True),
                             fullgraph=True)
    out = compiled(q, k, v, sinks)
    out.sum().backward()
    compiled_grads = [t.grad for t in (q, k, v, sinks)]
    q2, k2, v2, sinks2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v, sinks))
    eager = fgt.attention(q2, k2, v2, causal=True, sinks=sinks2, deterministic=True)
    eager.sum().backward()
    assert testsupport.max_error(out, eager) == 0
    # The compiled backward got the sinks too and gave them their gradient, in their dtype.
    assert compiled_grads[3].dtype == torch.bfloat16 and compiled_grads[3].abs().max() > 0
    for got, want in zip(compiled_grads, (q2.grad, k2.grad, v2.grad, sinks2.grad)):
        assert testsupport.max_error(got, want) <= 4e-3 * max(want.abs().max().item(), 1.0)
