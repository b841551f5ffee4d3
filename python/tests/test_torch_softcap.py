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
    """out, lse and (dq, dk, dv) in float64 for bshd q, k, v, bottom-right causal or not."""
    visible = testsupport.visible_keys(q.shape[1], k.shape[1], "bottom_right" if causal else "none", q.device)
    return testsupport.float64_bshd_attention(q, k, v, dout, scale, visible, softcap)


_assert_close = testsupport.assert_close_to_float64


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
    testsupport.check_packed_bf16_self_attention(
        7, [70, 1, 130],
        lambda q, k, v, cu, longest: fgt.varlen_attention(q, k, v, cu, cu, longest, longest, causal=True, softcap=2.0),
        lambda q, k, v, dout: _capped_reference(q, k, v, dout, 2.0, True, 1 / 8))


@pytest.mark.parametrize("softcap", [-1.0, float("nan"), float("inf")])
def test_a_bad_softcap_is_refused_naming_it(softcap):
    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(flashgen.FlashgenArgumentError, match="softcap"):
        fgt.attention(q, q, q, softcap=softcap)
