"""flashgen.torch's attention_chunk argument (Llama 4's chunked attention, FlashAttention-3's parameter): on any machine
with torch, the values it refuses and the top-left causal mask it does not take, and the ops' schemas and fake kernels
taking the chunk last (meta tensors, gradients through the ops' autograd, the ops' old positional calls); on the GPU,
attention(), varlen_attention() and attention_with_kvcache() outputs, lse and gradients against a float64 reference
whose mask keeps only the keys of each row's chunk (by floor division of positions, aligned bottom-right) within the
causal mask or window, explain() naming the chunk's kernels, torch.library.opcheck and torch.compile.
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
from flashgen.torch import _checks as fg_checks  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def _calls(**kwargs):
    """attention(), explain(), varlen_attention() and attention_with_kvcache() on meta tensors with these keywords, as
    (name, thunk) pairs: each checks its arguments before anything runs."""
    q, packed = _meta(1, 16, 2, 64), _meta(16, 2, 64)
    cu = torch.tensor([0, 16], dtype=torch.int32, device="meta")
    return (("attention", lambda: fgt.attention(q, q, q, **kwargs)),
            ("explain", lambda: fgt.explain(q, q, q, **kwargs)),
            ("varlen_attention", lambda: fgt.varlen_attention(packed, packed, packed, cu, cu, 16, 16, **kwargs)),
            ("attention_with_kvcache", lambda: fgt.attention_with_kvcache(q, q, q, **kwargs)))


@pytest.mark.parametrize("attention_chunk", [-1, 1.5, True, False, "64", None, 2 ** 31, (64,)])
def test_a_bad_attention_chunk_is_refused_naming_it(attention_chunk):
    for name, call in _calls(attention_chunk=attention_chunk):
        with pytest.raises(flashgen.FlashgenArgumentError, match="attention_chunk must be an int >= 0") as caught:
            call()
        assert caught.value.status == flashgen._lib.ERROR_INVALID_ARGUMENT, name


def test_a_chunk_is_aligned_bottom_right():
    for name, call in _calls(causal=True, causal_align="top_left", attention_chunk=64):
        with pytest.raises(flashgen.FlashgenArgumentError,
                           match="attention_chunk: .*causal_align='top_left'") as caught:
            call()
        assert caught.value.status == flashgen._lib.ERROR_INVALID_ARGUMENT, name
    q = _meta(1, 16, 2, 64)
    # Without causal=True the alignment is not read, as for the masks and the window; a chunk of 0 is none.
    assert fgt.attention(q, q, q, causal_align="top_left", attention_chunk=64).shape == q.shape
    assert fgt.attention(q, q, q, causal=True, causal_align="top_left", attention_chunk=0).shape == q.shape


class _Index:
    """An integer that is not an int (numpy's int64, say): taken through __index__."""

    def __index__(self):
        return 64


def test_the_chunk_is_taken_as_an_int_of_the_c_abis_range():
    assert fg_checks._check_chunk(0, "top_left") == 0
    assert fg_checks._check_chunk(96, "bottom_right") == 96
    assert fg_checks._check_chunk(2 ** 31 - 1, "none") == 2 ** 31 - 1
    chunk = fg_checks._check_chunk(_Index(), "window")
    assert chunk == 64 and type(chunk) is int


def test_meta_tensors_take_a_chunk_through_the_ops_and_their_autograd():
    q = _meta(2, 128, 4, 64).requires_grad_(True)
    k, v = (_meta(2, 96, 2, 64).requires_grad_(True) for _ in range(2))
    for causal, window_size in ((True, (-1, -1)), (False, (-1, -1)), (False, (32, 0))):
        out, lse = fgt.attention(q, k, v, causal=causal, window_size=window_size, attention_chunk=48,
                                 return_lse=True)
        assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (2, 4, 128)
        out.sum().backward()  # the backward op's fake kernel, and one gradient (or None) per op input
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    packed, kv = _meta(300, 4, 64).requires_grad_(True), _meta(320, 2, 64).requires_grad_(True)
    cu_q, cu_k = (torch.tensor(offsets, dtype=torch.int32, device="meta") for offsets in ([0, 100, 100, 300],
                                                                                            [0, 120, 140, 320]))
    out = fgt.varlen_attention(packed, kv, kv, cu_q, cu_k, 200, 180, causal=True, attention_chunk=64)
    assert out.shape == packed.shape
    out.sum().backward()
    assert packed.grad.shape == packed.shape and kv.grad.shape == kv.shape
    q, cache = _meta(2, 4, 8, 64), _meta(2, 512, 2, 64)
    out, lse = fgt.attention_with_kvcache(q, cache, cache, cache_seqlens=300, causal=True, attention_chunk=256,
                                          num_splits=3, return_softmax_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (2, 8, 4)


@pytest.mark.parametrize("op", ["attention_forward", "attention_backward", "varlen_attention_forward",
                                "varlen_attention_backward", "attention_kvcache"])
def test_each_op_takes_the_chunk_as_a_defaulted_argument(op):
    arguments = {a.name: a for a in getattr(torch.ops.flashgen, op).default._schema.arguments}
    chunk = arguments["attention_chunk"]
    assert str(chunk.type) == "int" and chunk.default_value == 0


def test_the_ops_keep_their_old_positional_calls_and_take_the_chunk_after_them():
    q, k = _meta(1, 64, 4, 64), _meta(1, 80, 2, 64)
    out, lse = torch.ops.flashgen.attention_forward(q, k, k, 0.0, "bottom_right", "bshd", True, 0.0, -1, -1, None,
                                                    None)
    out, lse = torch.ops.flashgen.attention_forward(q, k, k, 0.0, "bottom_right", "bshd", True, 0.0, -1, -1, None,
                                                    None, 96)
    assert out.shape == q.shape and lse.shape == (1, 4, 64)
    dq, dk, dv, dsinks = torch.ops.flashgen.attention_backward(out, q, k, k, out, lse, 0.0, "bottom_right", "bshd",
                                                               True, 0.0, -1, -1, None, None, 96)
    assert dq.shape == q.shape and dk.shape == k.shape and dsinks.shape == (0,)
    packed, kv = _meta(100, 4, 64), _meta(120, 2, 64)
    cu_q, cu_k = (torch.tensor([0, n], dtype=torch.int32, device="meta") for n in (100, 120))
    out, lse = torch.ops.flashgen.varlen_attention_forward(packed, kv, kv, cu_q, cu_k, None, 100, 120, 0.0, "none",
                                                           False, None, 0.0, -1, -1, None, None, 48)
    assert out.shape == packed.shape and lse.shape == (4, 100)
    *grads, dsinks = torch.ops.flashgen.varlen_attention_backward(out, packed, kv, kv, out, lse, cu_q, cu_k, 100, 120,
                                                                  0.0, "none", False, 0.0, -1, -1, None, None, 48)
    assert [g.shape for g in grads] == [packed.shape, kv.shape, kv.shape] and dsinks.shape == (0,)
    q, cache = _meta(2, 1, 8, 64), _meta(2, 512, 2, 64)
    lens = torch.tensor([300, 7], dtype=torch.int32, device="meta")
    out, lse = torch.ops.flashgen.attention_kvcache(q, cache, cache, None, None, lens, None, 0.0, "bottom_right", 4)
    out, lse = torch.ops.flashgen.attention_kvcache(q, cache, cache, None, None, lens, None, 0.0, "bottom_right", 4, -1,
                                                    -1, None, 256)
    assert out.shape == q.shape and lse.shape == (2, 8, 1)


# ---------------------------------------------------------------------------------------------------------
# On the GPU.

def _gpu():
    missing = testsupport.gpu_missing()
    if missing:
        pytest.skip(f"GPU tests skipped: {missing}")


_assert_close = testsupport.assert_close_to_float64


def _chunked_visible(seqlen_q, seqlen_k, chunk, causal, window, device):
    """[seqlen_q, seqlen_k] bool: the keys of each row's chunk within the bottom-right causal mask (causal) and the
    window (left, right) ((-1, -1): none)."""
    visible = testsupport.chunk_keys(seqlen_q, seqlen_k, chunk, device)
    visible &= testsupport.visible_keys(seqlen_q, seqlen_k, "bottom_right" if causal else "none", device)
    return visible & testsupport.window_keys(seqlen_q, seqlen_k, window, device)


def _assert_lse_close(got, want):
    """lse: -inf (a row that sees no key) in the same places, within 1e-3 elsewhere."""
    live = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), live)
    assert testsupport.max_error(got[live], want[live]) <= 1e-3, testsupport.mismatch_report(
        "lse", got[live], want[live], 1e-3)


@pytest.mark.parametrize("dtype,head_dim,sq,sk,chunk,causal,window_size", [
    (torch.bfloat16, 128, 333, 333, 96, True, (-1, -1)),   # chunked causal (Llama 4), chunks not a multiple of 64
    (torch.float16, 64, 150, 400, 128, False, (-1, -1)),   # bidirectional within chunks, sq < sk
    (torch.bfloat16, 64, 300, 300, 64, True, (40, 0)),     # a causal window inside chunks of 64
    (torch.float16, 64, 300, 120, 48, False, (-1, -1)),    # sq > sk: rows 0..179 lie before key 0 and see no key
    (torch.bfloat16, 64, 300, 120, 100, True, (-1, -1)),   # the same, chunked causal
])
def test_attention_chunk_matches_the_float64_reference(dtype, head_dim, sq, sk, chunk, causal, window_size):
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(head_dim + sq + chunk)
    q = torch.randn(2, sq, 4, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    k = torch.randn(2, sk, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    v = torch.randn(2, sk, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    dout = torch.randn(2, sq, 4, head_dim, device="cuda", generator=generator).to(dtype)
    out, lse = fgt.attention(q, k, v, causal=causal, window_size=window_size, attention_chunk=chunk, return_lse=True)
    out.backward(dout)
    visible = _chunked_visible(sq, sk, chunk, causal, window_size, q.device)
    want, want_lse, grads = testsupport.float64_bshd_attention(q, k, v, dout, 1 / math.sqrt(head_dim), visible)
    _assert_close("out", out, want, dtype)
    _assert_lse_close(lse, want_lse)
    for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
        _assert_close(name, tensor.grad, want_grad, dtype)
    # Rows that see no key: out 0 and zero dq, exactly.
    dead = ~visible.any(dim=1)
    assert bool(dead.any()) == (sq > sk)
    assert torch.equal(out[:, dead], torch.zeros_like(out[:, dead]))
    assert torch.equal(q.grad[:, dead], torch.zeros_like(q.grad[:, dead]))
    # Without autograd (no node, the forward called directly) the same kernel runs on the same chunk.
    assert torch.equal(fgt.attention(q.detach(), k.detach(), v.detach(), causal=causal, window_size=window_size,
                                     attention_chunk=chunk), out)
    # The chunk changes the answer: the unchunked call differs by far more than the tolerance.
    plain = fgt.attention(q.detach(), k.detach(), v.detach(), causal=causal, window_size=window_size)
    assert testsupport.max_error(plain, want) > 0.05


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_attention_chunk_applies_within_each_sequence_empty_ones_included(causal):
    _gpu()
    chunk = 48
    # An empty sequence, one with keys and no query (zero dk, dv), and one whose rows 0..4 see no key.
    q_lens, k_lens = [70, 0, 0, 130, 9], [70, 0, 30, 200, 4]
    q, k, v, dout, cu_q, cu_k = testsupport.packed_gqa_batch(q_lens, k_lens, 71)
    out, lse, _ = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=causal,
                                       attention_chunk=chunk, return_attn_probs=True)
    out.backward(dout)
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(q_lens, k_lens)):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        if sq == 0:  # keys no query sees: zero dk and dv
            assert torch.equal(k.grad[keys], torch.zeros_like(k.grad[keys]))
            assert torch.equal(v.grad[keys], torch.zeros_like(v.grad[keys]))
        else:
            visible = _chunked_visible(sq, sk, chunk, causal, (-1, -1), q.device)
            want, want_lse, (dq, dk, dv) = testsupport.float64_bshd_attention(
                q[None, rows], k[None, keys], v[None, keys], dout[None, rows], 1 / 8, visible)
            _assert_close(f"out of sequence {b}", out[None, rows], want, torch.bfloat16)
            _assert_lse_close(lse[:, rows], want_lse[0])
            _assert_close(f"dq of sequence {b}", q.grad[None, rows], dq, torch.bfloat16)
            _assert_close(f"dk of sequence {b}", k.grad[None, keys], dk, torch.bfloat16)
            _assert_close(f"dv of sequence {b}", v.grad[None, keys], dv, torch.bfloat16)
        q0, k0 = q0 + sq, k0 + sk


@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("causal,new,lens", [
    (True, 8, [252, 1020, 3]),    # the new rows straddle the chunk boundaries at 256 and 1024
    (False, 8, [252, 1020, 3]),   # bidirectional: the rows before a boundary also see the new keys up to it
    (True, 1, [256, 1100, 3]),    # a decode step that opens a chunk sees its own key only
])
def test_decode_with_a_chunk_across_a_chunk_boundary(page_size, causal, new, lens):
    _gpu()
    batch, capacity, hq, hkv, d, chunk = 3, 2048, 8, 2, 64, 256
    generator = torch.Generator(device="cuda").manual_seed(81 + new)
    k_logical, v_logical = (torch.randn(batch, capacity, hkv, d, device="cuda", generator=generator)
                            .to(torch.float16) for _ in range(2))
    k_new, v_new = (torch.randn(batch, new, hkv, d, device="cuda", generator=generator).to(torch.float16)
                    for _ in range(2))
    q = torch.randn(batch, new, hq, d, device="cuda", generator=generator).to(torch.float16)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    table, k_cache, v_cache = None, k_logical.clone(), v_logical.clone()
    if page_size:  # the pages in reverse order
        table, k_cache, v_cache = testsupport.reversed_pages(k_logical, v_logical, page_size)
    wants = []
    for b, n in enumerate(lens):
        keys, values = (torch.cat([t[b:b + 1, :n], fresh[b:b + 1]], dim=1)
                        for t, fresh in ((k_logical, k_new), (v_logical, v_new)))
        visible = _chunked_visible(new, n + new, chunk, causal, (-1, -1), q.device)
        qs = q[b:b + 1]
        wants.append(testsupport.float64_bshd_attention(qs, keys, values, torch.zeros_like(qs), d ** -0.5, visible))
    for num_splits in (1, 4, 0):
        out, lse = fgt.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                              block_table=table, causal=causal, attention_chunk=chunk,
                                              num_splits=num_splits, return_softmax_lse=True)
        for b, (want, want_lse, _) in enumerate(wants):
            _assert_close(f"out of sequence {b}, num_splits {num_splits}", out[b:b + 1], want, torch.float16)
            _assert_lse_close(lse[b:b + 1], want_lse)
    # The chunk changes the answer: the unchunked call over the long cache differs by far more than the tolerance.
    plain = fgt.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens + new, block_table=table,
                                       causal=causal)
    assert testsupport.max_error(plain[1:2], wants[1][0]) > 0.05


def test_explain_names_the_chunk_kernels():
    _gpu()
    q = torch.randn(1, 256, 2, 64, device="cuda", dtype=torch.float16)
    for causal in (True, False):
        answer = fgt.explain(q, q, q, causal=causal, attention_chunk=64)
        assert "_chunk" in answer["forward"]["config"] and "_chunk" in answer["backward"]["config"]
    plain = fgt.explain(q, q, q, causal=True, backward=False)["forward"]["config"]
    assert "_chunk" not in plain


def test_the_ops_with_a_chunk_pass_opcheck():
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(91)
    q, k, v = (torch.randn(1, n, h, 64, device="cuda", generator=generator).to(torch.float16).requires_grad_(True)
               for n, h in ((150, 4), (170, 2), (170, 2)))
    # deterministic: opcheck compares the outputs and gradients of several runs.
    torch.library.opcheck(torch.ops.flashgen.attention_forward.default,
                          (q, k, v, 0.0, "bottom_right", "bshd", True, 0.0, -1, -1, None, None, 72))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.flashgen.attention_forward(q, k, v, 0.0, "none", "bshd", True, 0.0, -1, -1, None, None, 72)
    torch.library.opcheck(torch.ops.flashgen.attention_backward.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.0, "none", "bshd", True, 0.0, -1, -1, None,
                           None, 72))
    lens = torch.tensor([90, 7], dtype=torch.int32, device="cuda")
    cache = torch.randn(2, 128, 2, 64, device="cuda", generator=generator).to(torch.float16)
    torch.library.opcheck(torch.ops.flashgen.attention_kvcache.default,
                          (q[:, :1].expand(2, 1, 4, 64).contiguous(), cache, cache, None, None, lens, None, 0.0,
                           "bottom_right", 4, -1, -1, None, 64))


def test_attention_chunk_under_torch_compile():
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(17)
    q, k, v = (torch.randn(1, 200, 2, 64, device="cuda", generator=generator).to(torch.float16).requires_grad_(True)
               for _ in range(3))
    compiled = torch.compile(lambda q, k, v: fgt.attention(q, k, v, causal=True, attention_chunk=72,
                                                           deterministic=True), fullgraph=True)
    out = compiled(q, k, v)
    out.sum().backward()
    compiled_grads = [t.grad for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    eager = fgt.attention(q2, k2, v2, causal=True, attention_chunk=72, deterministic=True)
    eager.sum().backward()
    assert testsupport.max_error(out, eager) == 0
    # The compiled backward got the chunk too: its gradients are the eager call's, not the unchunked ones.
    for got, want in zip(compiled_grads, (q2.grad, k2.grad, v2.grad)):
        assert testsupport.max_error(got, want) <= 4e-3 * max(want.abs().max().item(), 1.0)
    q3, k3, v3 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    fgt.attention(q3, k3, v3, causal=True, deterministic=True).sum().backward()
    unchunked = (q3.grad, k3.grad, v3.grad)
    assert max(testsupport.max_error(got, plain) for got, plain in zip(compiled_grads, unchunked)) > 0.05
