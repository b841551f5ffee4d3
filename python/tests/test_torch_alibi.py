"""flashgen.torch's alibi_slopes argument on the GPU: attention() and varlen_attention() outputs and gradients
against a float64 reference that adds -slope * |i + seqlen_k - seqlen_q - j| to each score, slopes per head and
per batch entry and head, under both causal alignments and a soft cap, torch.compile, and the slopes it refuses.
"""

import math

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _calls as fg_calls, _dense as fg_dense  # noqa: E402

_assert_close = testsupport.assert_close_to_float64


def _slopes(batch, heads, per_batch):
    """Slopes that reorder the softmax of unit-variance scores within a few keys, different per head (and entry)."""
    slopes = 0.05 * torch.arange(1, heads + 1, device="cuda", dtype=torch.float32)
    return slopes[None] + 0.3 * torch.arange(batch, device="cuda")[:, None] if per_batch else slopes


@pytest.mark.parametrize("dtype,head_dim,causal_align,per_batch,softcap", [
    (torch.bfloat16, 128, "bottom_right", True, 0.0),
    (torch.float16, 64, None, False, 0.0),
    (torch.bfloat16, 64, "top_left", False, 2.0),
])
def test_attention_alibi_matches_the_float64_reference(dtype, head_dim, causal_align, per_batch, softcap):
    generator = torch.Generator(device="cuda").manual_seed(head_dim + 3)
    q = torch.randn(2, 150, 4, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    k = torch.randn(2, 190, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    v = torch.randn(2, 190, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    dout = torch.randn(2, 150, 4, head_dim, device="cuda", generator=generator).to(dtype)
    slopes = _slopes(2, 4, per_batch)
    causal = causal_align is not None
    out, lse = fgt.attention(q, k, v, causal=causal, causal_align=causal_align or "bottom_right", softcap=softcap,
                             alibi_slopes=slopes, return_lse=True)
    out.backward(dout)
    visible = testsupport.visible_keys(150, 190, causal_align or "none", q.device)
    bias = testsupport.alibi_bias(slopes, 150, 190, top_left=causal_align == "top_left")
    want, want_lse, grads = testsupport.float64_bshd_attention(q, k, v, dout, 1 / math.sqrt(head_dim), visible,
                                                               softcap, bias)
    _assert_close("out", out, want, dtype)
    assert testsupport.max_error(lse, want_lse) <= 2e-3
    for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
        _assert_close(name, tensor.grad, want_grad, dtype)
    # The bias changes the answer: a call without it differs by far more than the tolerance.
    plain = fgt.attention(q.detach(), k.detach(), v.detach(), causal=causal,
                          causal_align=causal_align or "bottom_right", softcap=softcap)
    assert testsupport.max_error(plain, want) > 0.05


def test_attention_alibi_under_torch_compile():
    generator = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(1, 96, 2, 64, device="cuda", generator=generator).to(torch.float16).requires_grad_(True)
               for _ in range(3))
    slopes = _slopes(1, 2, False)
    compiled = torch.compile(lambda q, k, v, s: fgt.attention(q, k, v, causal=True, alibi_slopes=s), fullgraph=True)
    out = compiled(q, k, v, slopes)
    out.sum().backward()
    compiled_grads = [t.grad for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    eager = fgt.attention(q2, k2, v2, causal=True, alibi_slopes=slopes)
    eager.sum().backward()
    assert testsupport.max_error(out, eager) == 0
    # The compiled backward got the slopes too: its gradients are the eager call's (up to the order of dQ's atomic
    # adds; without the bias they would differ by far more).
    for got, want in zip(compiled_grads, (q2.grad, k2.grad, v2.grad)):
        assert testsupport.max_error(got, want) <= 4e-3 * max(want.abs().max().item(), 1.0)


def test_a_warm_call_reads_its_own_slopes_and_sinks(monkeypatch):
    """A second inference call of a signature with ALiBi slopes and bf16 sinks skips the argument checks through its
    plan and reads the call's own slopes and sinks: its output and lse are bitwise those of the same call made
    cold (in either backend: calls without autograd keep their plans)."""
    generator = torch.Generator(device="cuda").manual_seed(41)
    q, k, v = (torch.randn(1, 100, 4, 64, device="cuda", generator=generator).to(torch.bfloat16) for _ in range(3))
    calls = [(_slopes(1, 4, False) * (i + 1), torch.randn(4, device="cuda", generator=generator).to(torch.bfloat16))
             for i in range(2)]
    checked = []
    real_check = fg_dense._check_inputs
    monkeypatch.setattr(fg_dense, "_check_inputs", lambda *a: checked.append(1) or real_check(*a))
    with torch.no_grad():
        fgt.attention(q, k, v, causal=True, alibi_slopes=calls[0][0], sinks=calls[0][1])
        checked.clear()
        warm = fgt.attention(q, k, v, causal=True, alibi_slopes=calls[1][0], sinks=calls[1][1], return_lse=True)
        assert not checked, "the warm call took the checked path, not its plan"
        fg_calls._plans.forward.clear()
        cold = fgt.attention(q, k, v, causal=True, alibi_slopes=calls[1][0], sinks=calls[1][1], return_lse=True)
        assert checked
    assert torch.equal(warm[0], cold[0]) and torch.equal(warm[1], cold[1])


def test_varlen_attention_alibi_matches_each_sequence():
    slopes = _slopes(1, 2, False)
    testsupport.check_packed_bf16_self_attention(
        9, [70, 1, 130],
        lambda q, k, v, cu, longest: fgt.varlen_attention(q, k, v, cu, cu, longest, longest, causal=True,
                                                          alibi_slopes=slopes),
        lambda q, k, v, dout: testsupport.float64_bshd_attention(
            q, k, v, dout, 1 / 8, testsupport.visible_keys(q.shape[1], q.shape[1], "bottom_right", q.device), 0.0,
            testsupport.alibi_bias(slopes, q.shape[1], q.shape[1])))


@pytest.mark.parametrize("slopes,match", [
    (lambda: torch.ones(3, device="cuda"), r"alibi_slopes must be float32 \[heads_q\] = \[2\]"),
    (lambda: torch.ones(2, device="cuda", dtype=torch.float16), "alibi_slopes must be float32"),
    (lambda: torch.ones(2), "alibi_slopes must be on cuda"),
    (lambda: [0.5, 0.25], "alibi_slopes must be a torch.Tensor"),
])
def test_bad_slopes_are_refused_naming_them(slopes, match):
    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(flashgen.FlashgenArgumentError, match=match):
        fgt.attention(q, q, q, alibi_slopes=slopes())


def test_kvcache_checks_its_slopes():
    # KV-cache calls take ALiBi (test_torch_kvcache.py checks their numbers); slopes of the wrong shape are named.
    q = torch.randn(1, 1, 2, 64, device="cuda", dtype=torch.float16)
    cache = torch.randn(1, 32, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(flashgen.FlashgenArgumentError, match=r"alibi_slopes must be float32 \[heads_q\] = \[2\]"):
        fgt.attention_with_kvcache(q, cache, cache, alibi_slopes=torch.ones(3, device="cuda"))
