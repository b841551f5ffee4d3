"""flashgen.torch.varlen_attention on the GPU: each packed sequence's output, lse and gradients against its float64
reference (SDPA's MATH backend), seqused_k, deterministic gradients, the custom ops under torch.library.opcheck,
torch.compile and CUDA-graph capture, and the arguments it refuses.
"""

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen.torch as fgt  # noqa: E402


def _packed(lens, heads, head_dim, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(sum(lens), heads, head_dim, device="cuda", generator=generator).to(dtype)


_offsets = testsupport.packed_offsets


def _check_sequences(out, lse, q, k, v, q_lens, k_lens, used, mask, dtype):
    """Each sequence's rows of out and lse against its own float64 reference."""
    q0 = k0 = 0
    for sq, sk_rows, sk in zip(q_lens, k_lens, used):
        if sq > 0:
            got, got_lse = out[q0:q0 + sq], lse[:, q0:q0 + sq]
            if sk == 0:  # no key: output 0, lse -inf
                assert torch.equal(got, torch.zeros_like(got))
                assert torch.isneginf(got_lse).all()
            else:
                qs, ks, vs = q[q0:q0 + sq, None], k[k0:k0 + sk, None], v[k0:k0 + sk, None]
                zeros = torch.zeros_like(qs)
                want, want_lse, *_ = testsupport.reference_attention(
                    qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), zeros.transpose(0, 1), mask, None,
                    "bshd")
                want = want[0]
                allowed = 2 * testsupport.EPSILON[str(dtype).replace("torch.", "")] * want.abs().max().item() + 1e-3
                assert testsupport.max_error(got, want) <= allowed, testsupport.mismatch_report(
                    "out", got, want, allowed)
                live = torch.isfinite(want_lse[0])
                assert torch.equal(torch.isneginf(got_lse), ~live)
                assert testsupport.max_error(got_lse[live], want_lse[0][live]) <= 1e-3
        q0, k0 = q0 + sq, k0 + sk_rows


@pytest.mark.parametrize("dtype,mask", [(torch.float16, "bottom_right"), (torch.bfloat16, "top_left"),
                                        (torch.float16, "none")])
def test_each_sequence_matches_its_reference(dtype, mask):
    q_lens, k_lens = [3, 0, 130, 64, 1], [5, 2, 200, 40, 0]
    q, k, v = (_packed(lens, heads, 64, dtype, seed)
               for lens, heads, seed in ((q_lens, 4, 1), (k_lens, 2, 2), (k_lens, 2, 3)))
    out, lse, probs = fgt.varlen_attention(q, k, v, _offsets(q_lens), _offsets(k_lens), max(q_lens), max(k_lens),
                                           causal=mask != "none",
                                           causal_align=mask if mask != "none" else "bottom_right",
                                           return_attn_probs=True)
    assert probs is None and out.shape == q.shape and lse.shape == (4, sum(q_lens)) and lse.dtype == torch.float32
    _check_sequences(out, lse, q, k, v, q_lens, k_lens, k_lens, mask, dtype)


def test_seqused_k_limits_each_sequences_keys():
    q_lens, k_lens, used = [1, 4, 100], [300, 64, 256], [217, 64, 0]
    q, k, v = (_packed(lens, heads, 128, torch.bfloat16, seed)
               for lens, heads, seed in ((q_lens, 2, 4), (k_lens, 2, 5), (k_lens, 2, 6)))
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse, _ = fgt.varlen_attention(q, k, v, _offsets(q_lens), _offsets(k_lens), max(q_lens), max(k_lens),
                                       causal=True, seqused_k=seqused, return_attn_probs=True)
    _check_sequences(out, lse, q, k, v, q_lens, k_lens, used, "bottom_right", torch.bfloat16)


def _small_batch():
    q_lens, k_lens = [17, 64, 5], [33, 64, 90]
    q, k, v = (_packed(lens, heads, 64, torch.float16, seed)
               for lens, heads, seed in ((q_lens, 4, 7), (k_lens, 4, 8), (k_lens, 4, 9)))
    return q, k, v, _offsets(q_lens), _offsets(k_lens), max(q_lens), max(k_lens)


def test_opcheck_compile_and_cuda_graph_agree_with_eager():
    q, k, v, cu_q, cu_k, max_q, max_k = _small_batch()
    grads = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.flashgen.varlen_attention_forward.default,
                          (*grads, cu_q, cu_k, None, max_q, max_k, 0.0, "bottom_right", True))
    eager = fgt.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)

    compiled = torch.compile(lambda *a: fgt.varlen_attention(*a, causal=True), fullgraph=True)
    assert torch.equal(compiled(q, k, v, cu_q, cu_k, max_q, max_k), eager)

    static = [t.clone() for t in (q, k, v)]
    fgt.varlen_attention(*static, cu_q, cu_k, max_q, max_k, causal=True)  # kernels loaded before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fgt.varlen_attention(*static, cu_q, cu_k, max_q, max_k, causal=True)
    fresh = [t * 0.5 for t in (q, k, v)]
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    assert torch.equal(captured, fgt.varlen_attention(*fresh, cu_q, cu_k, max_q, max_k, causal=True))


def test_refused_arguments_name_themselves():
    q, k, v, cu_q, cu_k, max_q, max_k = _small_batch()
    with pytest.raises(fgt.FlashgenArgumentError, match="cu_seqlens_q: expected a 1-d torch.int32 tensor"):
        fgt.varlen_attention(q, k, v, cu_q.long(), cu_k, max_q, max_k)
    with pytest.raises(fgt.FlashgenArgumentError, match="q: expected a 3-d packed tensor"):
        fgt.varlen_attention(q[None], k, v, cu_q, cu_k, max_q, max_k)
    with pytest.raises(fgt.FlashgenArgumentError, match="max_seqlen_q must be in"):
        fgt.varlen_attention(q, k, v, cu_q, cu_k, q.shape[0] + 1, max_k)
    with pytest.raises(fgt.FlashgenArgumentError, match="dropout_p must be 0.0"):
        fgt.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="no backward with seqused_k"):
        fgt.varlen_attention(q.clone().requires_grad_(), k, v, cu_q, cu_k, max_q, max_k,
                             seqused_k=torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("dtype,mask", [(torch.float16, "bottom_right"), (torch.bfloat16, "top_left")])
def test_gradients_of_each_sequence_match_its_reference(dtype, mask):
    q_lens, k_lens = [3, 0, 130, 64, 9], [5, 20, 200, 40, 0]
    q, k, v = (_packed(lens, heads, 64, dtype, seed).requires_grad_()
               for lens, heads, seed in ((q_lens, 4, 11), (k_lens, 2, 12), (k_lens, 2, 13)))
    dout = _packed(q_lens, 4, 64, dtype, 14)
    out = fgt.varlen_attention(q, k, v, _offsets(q_lens), _offsets(k_lens), max(q_lens), max(k_lens), causal=True,
                               causal_align=mask)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    q0 = k0 = 0
    eps = testsupport.EPSILON[str(dtype).replace("torch.", "")]
    for sq, sk in zip(q_lens, k_lens):
        got = (dq[q0:q0 + sq], dk[k0:k0 + sk], dv[k0:k0 + sk])
        if sq == 0 or sk == 0:  # no pair of the sequence sees the other side: zero gradients
            assert all(torch.equal(g, torch.zeros_like(g)) for g in got)
        else:
            bshd = [t[s0:s0 + n, None].transpose(0, 1).detach()
                    for t, s0, n in ((q, q0, sq), (k, k0, sk), (v, k0, sk), (dout, q0, sq))]
            want = testsupport.reference_attention(*bshd, mask, None, "bshd")[2:5]  # dq, dk, dv
            for name, g, w in zip(("dq", "dk", "dv"), got, want):
                w = w[0]
                allowed = 8 * eps * w.abs().max().item() + 1e-3
                assert testsupport.max_error(g, w) <= allowed, testsupport.mismatch_report(name, g, w, allowed)
        q0, k0 = q0 + sq, k0 + sk


def test_deterministic_gradients_repeat_bitwise():
    q, k, v, cu_q, cu_k, max_q, max_k = _small_batch()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    runs = []
    for _ in range(2):
        out = fgt.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_prefill_over_a_paged_cache_matches_the_packed_keys():
    """The same batch with its keys and values in shuffled pages of 16 rows (block_table): every sequence's output
    and lse against its reference, and close to the packed call's (on sm_90 another kernel family runs that)."""
    q_lens, k_lens = [3, 0, 130, 64, 1], [5, 2, 200, 40, 0]
    q, k, v = (_packed(lens, heads, 64, torch.bfloat16, seed)
               for lens, heads, seed in ((q_lens, 8, 21), (k_lens, 2, 22), (k_lens, 2, 23)))
    page, max_pages = 16, 14
    order = torch.randperm(len(k_lens) * max_pages + 3, device="cuda")
    table = order[:len(k_lens) * max_pages].view(len(k_lens), max_pages).to(torch.int32)
    k_cache, v_cache = (torch.randn(order.numel(), page, 2, 64, device="cuda").to(torch.bfloat16) for _ in range(2))
    testsupport.fill_pages((k_cache, v_cache), (k, v), k_lens, table, page)
    cu_q, cu_k = _offsets(q_lens), _offsets(k_lens)
    packed, packed_lse, _ = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True,
                                                 return_attn_probs=True)
    out, lse, _ = fgt.varlen_attention(q, k_cache, v_cache, cu_q, cu_k, max(q_lens), max(k_lens), causal=True,
                                       block_table=table, return_attn_probs=True)
    _check_sequences(out, lse, q, k, v, q_lens, k_lens, k_lens, "bottom_right", torch.bfloat16)
    live = torch.isfinite(packed_lse)
    assert torch.equal(torch.isfinite(lse), live)
    assert testsupport.max_error(out, packed) <= 2e-2 and testsupport.max_error(lse[live], packed_lse[live]) <= 1e-3
    with pytest.raises(NotImplementedError, match="block_table"):
        fgt.varlen_attention(q.requires_grad_(), k_cache, v_cache, cu_q, cu_k, max(q_lens), max(k_lens),
                             block_table=table)
