"""flashgen.torch's user-defined variants (mask_mod, score_mod with score_grad, score_bias, variant_args): on any
machine with torch and the library, bad variant_args refused by name; on the GPU, attention() and varlen_attention()
outputs and gradients against a float64 reference of the same functions written with torch (a document mask, a
prefix-LM mask with rows that see no key, a relative-position bias table, a soft cap as a score function), a
BlockMask's kept classes giving the same bits as classes per call, a C++ error coming back with NVRTC's message at
the body's line, a score_mod without score_grad refusing its backward, and torch.compile(fullgraph=True) keeping
dense and packed calls with a user variant in its graph as the variant ops, bit for bit as eager.
"""

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"flashgen.torch GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402


def _inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", generator=generator).to(dtype)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", generator=generator).to(dtype)
            for _ in range(2))
    dout = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", generator=generator).to(dtype)
    return q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True), dout


def _check(q, k, v, dout, got, want):
    out, _, grads = want
    got.backward(dout)
    testsupport.assert_close_to_float64("out", got, out, q.dtype)
    for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
        testsupport.assert_close_to_float64(name, tensor.grad, want_grad, q.dtype)


@pytest.mark.parametrize("deterministic", [False, True])
def test_document_mask_matches_float64(deterministic):
    q, k, v, dout = _inputs(1, 517, 517, 4, 2, 128, torch.bfloat16, 11)
    doc = (torch.rand(517, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)) < 0.02)
    doc = doc.cumsum(0).to(torch.int32)
    # Block classes per head, and (deterministic) once for every head.
    got = fgt.attention(q, k, v, causal=True, deterministic=deterministic,
                        mask_mod="return doc[q_idx] == doc[kv_idx];", variant_args={"doc": doc},
                        mask_same_for_heads=deterministic)
    visible = (doc[:, None] == doc[None, :]) & torch.ones(517, 517, dtype=torch.bool, device="cuda").tril()
    _check(q, k, v, dout, got, testsupport.float64_bshd_attention(q, k, v, dout, 128 ** -0.5, visible))


def test_a_block_mask_keeps_the_classes_across_calls():
    """Layers of one step sharing a BlockMask: the first call of each pass classifies, the later ones reuse the classes
    and give the same bits as calls that classify for themselves (deterministic backward)."""
    q, k, v, dout = _inputs(2, 700, 700, 4, 2, 64, torch.bfloat16, 21)
    doc = (torch.rand(2, 700, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5)) < 0.01)
    doc = doc.cumsum(1).to(torch.int32).flatten()
    kw = dict(causal=True, deterministic=True, mask_mod="return doc[batch * 700 + q_idx] == doc[batch * 700 + kv_idx];",
              variant_args={"doc": doc}, mask_same_for_heads=True)

    def step(**extra):
        q.grad = k.grad = v.grad = None
        out = fgt.attention(q, k, v, **kw, **extra)
        out.backward(dout)
        return out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()

    alone = step()
    kept = fgt.BlockMask()
    for _ in range(3):  # the first computes, the others reuse
        for name, got, want in zip(("out", "dq", "dk", "dv"), step(block_mask=kept), alone):
            assert torch.equal(got, want), name
    with pytest.raises(flashgen.FlashgenArgumentError, match="block_mask must be a flashgen.torch.BlockMask"):
        fgt.attention(q, k, v, **kw, block_mask="kept")
    with pytest.raises(flashgen.FlashgenArgumentError, match="block_mask comes with a mask_mod"):
        fgt.attention(q, k, v, score_bias="return 0.f;", block_mask=kept)


def test_prefix_lm_mask_with_empty_rows_matches_float64():
    q, k, v, dout = _inputs(1, 200, 333, 2, 1, 64, torch.float16, 12)
    prefix, offset = 70, 333 - 200
    got, lse = fgt.attention(q, k, v, mask_mod="if (q_idx % 7 == 3) return false;\n"
                                               "return kv_idx < prefix || kv_idx <= q_idx + offset;",
                             variant_args={"prefix": prefix, "offset": offset}, return_lse=True)
    i, j = torch.arange(200, device="cuda")[:, None], torch.arange(333, device="cuda")[None, :]
    visible = ((j < prefix) | (j <= i + offset)) & (i % 7 != 3)
    assert torch.isneginf(lse[0, :, 3]).all() and (got[0, 3] == 0).all()
    _check(q, k, v, dout, got, testsupport.float64_bshd_attention(q, k, v, dout, 64 ** -0.5, visible))


def test_relative_bias_table_and_user_soft_cap_match_float64():
    q, k, v, dout = _inputs(1, 257, 190, 2, 2, 96, torch.float16, 13)
    table = (0.6 * torch.sin(0.37 * torch.arange(2 * 1025, device="cuda"))).float()
    got = fgt.attention(q, k, v, window_size=(50, 9), variant_helpers="constexpr int kMax = 512;",
                        score_bias="return rel[head * (2 * kMax + 1) + kv_idx - q_idx + kMax];",
                        variant_args={"rel": table})
    i, j = torch.arange(257, device="cuda")[:, None], torch.arange(190, device="cuda")[None, :]
    diagonal = i + 190 - 257
    visible = (j >= diagonal - 50) & (j <= diagonal + 9)
    bias = torch.stack([table[h * 1025 + (j - i + 512)] for h in range(2)])[None]
    _check(q, k, v, dout, got, testsupport.float64_bshd_attention(q, k, v, dout, 96 ** -0.5, visible, bias=bias))

    q, k, v, dout = _inputs(2, 150, 150, 4, 2, 128, torch.bfloat16, 14)
    got = fgt.attention(q, k, v, causal=True, causal_align="top_left", score_mod="return cap * tanhf(score / cap);",
                        score_grad="const float t = modified / cap;\nreturn 1.f - t * t;", variant_args={"cap": 2.0})
    visible = torch.ones(150, 150, dtype=torch.bool, device="cuda").tril()
    _check(q, k, v, dout, got,
           testsupport.float64_bshd_attention(q, k, v, dout, 128 ** -0.5, visible, softcap=2.0))


@pytest.mark.parametrize("deterministic", [False, True])
def test_packed_documents_take_each_sequence_s_own_positions(deterministic):
    # Per sequence block classes: query rows 128 .. 256 of the 257-row sequence skip its first key block.
    lens = [130, 1, 257, 64]

    def attend(q, k, v, cu, max_seqlen):
        # Within each packed sequence, keys of the same half of the sequence (positions are the sequence's own).
        return fgt.varlen_attention(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True, deterministic=deterministic,
                                    mask_mod="return (q_idx >= half[batch]) == (kv_idx >= half[batch]);",
                                    variant_args={"half": torch.tensor([n // 2 for n in lens], dtype=torch.int32,
                                                                       device="cuda")})

    def reference(q, k, v, dout):
        n = q.shape[1]
        i, j = torch.arange(n, device="cuda")[:, None], torch.arange(n, device="cuda")[None, :]
        visible = (j <= i) & ((i >= n // 2) == (j >= n // 2))
        return testsupport.float64_bshd_attention(q, k, v, dout, 64 ** -0.5, visible)

    testsupport.check_packed_bf16_self_attention(21, lens, attend, reference)


def test_user_errors_come_back_by_name():
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(flashgen.FlashgenError, match=r"mask_mod\(2\).*undefined") as caught:
        fgt.attention(q, q, q, mask_mod="const int d = 1;\nreturn d == documents[kv_idx];")
    assert caught.value.status == flashgen._lib.ERROR_COMPILE
    with pytest.raises(flashgen.FlashgenArgumentError, match=r"variant_args\['doc'\] must be float32, int32"):
        fgt.attention(q, q, q, mask_mod="return true;", variant_args={"doc": q})
    with pytest.raises(flashgen.FlashgenArgumentError, match="score_grad, helpers and variant_args come with"):
        fgt.attention(q, q, q, score_grad="return 1.f;")
    leaf = q.clone().requires_grad_(True)
    out = fgt.attention(leaf, q, q, score_mod="return score * 0.5f;")  # no score_grad: forward only
    with pytest.raises(flashgen.FlashgenArgumentError, match="has a score_mod but no score_grad"):
        out.sum().backward()


def test_torch_compile_keeps_a_user_variant_in_its_graph():
    """Under torch.compile(fullgraph=True) calls with a user variant go into the graph as the variant ops (a graph
    break would raise), dense and packed, with a tensor and a number among variant_args, giving eager's outputs and
    gradients bit for bit (deterministic backward)."""
    torch._dynamo.reset()
    q, k, v, dout = _inputs(1, 300, 300, 4, 2, 64, torch.bfloat16, 31)
    doc = (torch.arange(300, device="cuda") // 97).to(torch.int32)
    cu = torch.tensor([0, 120, 300], dtype=torch.int32, device="cuda")

    def dense(q, k, v):
        out = fgt.attention(q, k, v, causal=True, deterministic=True, mask_mod="return doc[q_idx] == doc[kv_idx];",
                            variant_args={"doc": doc})
        return out * 2

    def packed(q, k, v):
        return fgt.varlen_attention(q[0], k[0], v[0], cu, cu, 180, 180, causal=True, deterministic=True,
                                    score_bias="return -slope * (float)(q_idx - kv_idx);", variant_args={"slope": 0.25})

    for run, grad_out in ((dense, dout), (packed, dout[0])):
        eager = run(q, k, v)
        eager_grads = torch.autograd.grad(eager, (q, k, v), grad_out)
        compiled = torch.compile(run, fullgraph=True)(q, k, v)
        compiled_grads = torch.autograd.grad(compiled, (q, k, v), grad_out)
        assert torch.equal(compiled, eager), run.__name__
        assert all(torch.equal(a, b) for a, b in zip(compiled_grads, eager_grads)), run.__name__
