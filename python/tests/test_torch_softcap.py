"""flashgen.torch's softcap argument on the GPU: attention() and varlen_attention() outputs and gradients against a
float64 reference that caps each score s to softcap * tanh(s / softcap) before the softmax, and the values it
refuses.
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


def _capped_reference(q, k, v, dout, softcap, causal, scale):
    """out, lse and (dq, dk, dv) in float64 for bshd q, k, v (GQA by repeating k and v), bottom-right causal."""
    q64, k64, v64 = (t.double().detach().requires_grad_(True) for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kr, vr = (t.repeat_interleave(group, dim=2) for t in (k64, v64))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kr) * scale
    s = softcap * torch.tanh(s / softcap)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vr)
    out.backward(dout.double())
    return out.detach(), lse.detach(), (q64.grad, k64.grad, v64.grad)


def _assert_close(name, got, want, dtype):
    # bf16 holds 8 bits of mantissa, fp16 11: a few roundings of the output's scale.
    allowed = (3e-2 if dtype == torch.bfloat16 else 4e-3) * max(want.abs().max().item(), 1.0)
    error = testsupport.max_error(got, want)
    assert error <= allowed, testsupport.mismatch_report(name, got, want, allowed)


@pytest.mark.parametrize("dtype,head_dim,causal,softcap", [(torch.bfloat16, 128, True, 1.5),
                                                           (torch.float16, 64, False, 5.0)])
def test_attention_softcap_matches_the_float64_reference(dtype, head_dim, causal, softcap):
    generator = torch.Generator(device="cuda").manual_seed(head_dim)
    q = torch.randn(2, 150, 4, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    k = torch.randn(2, 190, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    v = torch.randn(2, 190, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    dout = torch.randn(2, 150, 4, head_dim, device="cuda", generator=generator).to(dtype)
    out, lse = fgt.attention(q, k, v, causal=causal, softcap=softcap, return_lse=True)
    out.backward(dout)
    want, want_lse, grads = _capped_reference(q, k, v, dout, softcap, causal, 1 / math.sqrt(head_dim))
    _assert_close("out", out, want, dtype)
    assert testsupport.max_error(lse, want_lse) <= 1e-3
    for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
        _assert_close(name, tensor.grad, want_grad, dtype)
    # The cap changes the answer: an uncapped call differs by far more than the tolerance.
    plain = fgt.attention(q.detach(), k.detach(), v.detach(), causal=causal)
    assert testsupport.max_error(plain, want) > 0.05


def test_varlen_attention_softcap_matches_each_sequence():
    generator = torch.Generator(device="cuda").manual_seed(7)
    lens = [70, 1, 130]
    cu = torch.tensor([0, 70, 71, 201], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(201, 2, 64, device="cuda", generator=generator).to(torch.bfloat16).requires_grad_(True)
               for _ in range(3))
    dout = torch.randn(201, 2, 64, device="cuda", generator=generator).to(torch.bfloat16)
    out = fgt.varlen_attention(q, k, v, cu, cu, 130, 130, causal=True, softcap=2.0)
    out.backward(dout)
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        want, _, grads = _capped_reference(q[None, rows], k[None, rows], v[None, rows], dout[None, rows], 2.0, True,
                                           1 / 8)
        _assert_close("out", out[None, rows], want, torch.bfloat16)
        for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
            _assert_close(name, tensor.grad[None, rows], want_grad, torch.bfloat16)
        start += n


@pytest.mark.parametrize("softcap", [-1.0, float("nan"), float("inf")])
def test_a_bad_softcap_is_refused_naming_it(softcap):
    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(flashgen.FlashgenArgumentError, match="softcap"):
        fgt.attention(q, q, q, softcap=softcap)
