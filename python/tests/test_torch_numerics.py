"""flashgen.torch.attention on the GPU against scaled_dot_product_attention's MATH backend in float64: outputs, lse
and gradients over odd shapes, grouped and multi-query heads, both causal alignments (rows that see no key
included), both layouts, explicit scales and non-contiguous inputs; bitwise-repeatable deterministic gradients;
inputs read in place when their strides allow it; bad arguments raising with the library's message.

Tolerances (testsupport.tolerance): PyTorch's own attention in the same dtype, measured against the same float64
reference on the same inputs, sets the error a torch user already accepts; flashgen may be 2x (outputs) or 3x
(gradients, whose sums run over whole sequences) that, plus one epsilon of the dtype at the reference's largest
magnitude. lse is compared absolutely (see _LSE_TOLERANCE).
"""

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _calls as fg_calls  # noqa: E402

# lse = log Σ exp(scores) in fp32 from exact fp16/bf16 products accumulated in fp32 (error ≈ head_dim · 2^-24 ·
# |q||k| ≈ 1e-5) and exp2.approx (2^-22 relative): 1e-3 leaves margin yet catches a key wrongly masked or
# unmasked, which moves lse by about that key's probability (≈ 1 / seqlen_k ≥ 3e-3 here).
_LSE_TOLERANCE = 1e-3

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _randn(*shape, dtype, generator):
    return torch.randn(*shape, dtype=torch.float32, device="cuda", generator=generator).to(dtype)


def _seq_dim(layout):
    return 1 if layout == "bshd" else 2


def _shape(layout, batch, seqlen, heads, head_dim):
    return (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen, head_dim)


def _attention_kwargs(mask, layout, scale, deterministic):
    causal = mask != "none"
    return dict(causal=causal, causal_align=mask if causal else "bottom_right", scale=scale, layout=layout,
                deterministic=deterministic)


def run_flashgen(q, k, v, dout, mask, layout, scale, deterministic):
    """out, lse, dq, dk, dv from flashgen.torch, through autograd, with poisoned allocator blocks beforehand."""
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = (q.shape[i] for i in ((0, 1, 2, 3) if layout == "bshd" else (0, 2, 1, 3)))
    rows = batch * heads_q * seqlen_q
    testsupport.poison_allocator(q.device, 2 * q.numel(), 4 * rows, 2 * q.numel(), 2 * k.numel(), 2 * v.numel(),
                                 4 * rows * (head_dim + 1) + 512)
    out, lse = fgt.attention(qg, kg, vg, return_lse=True, **_attention_kwargs(mask, layout, scale, deterministic))
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    return out.detach(), lse, dq, dk, dv


def check_against_reference(q, k, v, dout, mask, layout, scale=None, deterministic=False):
    dtype_name = str(q.dtype).replace("torch.", "")
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv, live = testsupport.reference_attention(q, k, v, dout, mask, scale,
                                                                                     layout)
    own = testsupport.sdpa_attention(q, k, v, dout, mask, scale, layout)  # PyTorch's own, in q's dtype
    out, lse, dq, dk, dv = run_flashgen(q, k, v, dout, mask, layout, scale, deterministic)

    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(ref_lse.shape)
    assert not lse.requires_grad
    for got, want in ((dq, q), (dk, k), (dv, v)):
        assert got.shape == want.shape and got.dtype == want.dtype

    seq = _seq_dim(layout)
    dead = ~live
    if dead.any():  # rows that see no key: output 0, lse -inf, no gradient, never NaN
        rows = dead.nonzero().flatten()
        assert float(out.index_select(seq, rows).abs().max()) == 0.0
        assert float(dq.index_select(seq, rows).abs().max()) == 0.0
        assert bool((lse[:, :, dead] == float("-inf")).all())

    lse_error = testsupport.max_error(lse[:, :, live], ref_lse[:, :, live])
    assert lse_error <= _LSE_TOLERANCE, testsupport.mismatch_report("lse", lse[:, :, live], ref_lse[:, :, live],
                                                                     _LSE_TOLERANCE)
    report = []
    for name, got, ref, torch_own, factor in (("out", out, ref_out, own[0], 2), ("dq", dq, ref_dq, own[2], 3),
                                              ("dk", dk, ref_dk, own[3], 3), ("dv", dv, ref_dv, own[4], 3)):
        torch_error = testsupport.max_error(torch_own, ref)
        allowed = testsupport.tolerance(name, ref, torch_error, dtype_name, factor)
        error = testsupport.max_error(got, ref)
        report.append(f"{name}: flashgen {error:.3g}, torch {torch_error:.3g}, allowed {allowed:.3g}")
        assert error <= allowed, testsupport.mismatch_report(name, got, ref, allowed) + "\n" + "\n".join(report)
    print("; ".join(report))
    return out, lse, dq, dk, dv


# dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, mask, layout, scale, deterministic
CASES = [
    ("float16", 2, 113, 77, 4, 4, 64, "none", "bshd", None, False),
    ("bfloat16", 1, 130, 257, 8, 2, 128, "bottom_right", "bhsd", None, False),
    ("float16", 2, 200, 90, 6, 3, 64, "bottom_right", "bshd", None, True),  # query rows 0..109 see no key
    ("bfloat16", 3, 97, 161, 4, 1, 64, "top_left", "bshd", 0.3, False),     # multi-query
    ("float16", 1, 1, 300, 2, 2, 128, "bottom_right", "bhsd", None, False),  # one query row, as in decoding
    ("bfloat16", 2, 250, 64, 4, 2, 128, "top_left", "bhsd", None, True),
    ("float16", 2, 65, 65, 2, 2, 40, "none", "bshd", 0.125, False),         # head_dim 40
]


@pytest.mark.parametrize("dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, mask, layout, scale, "
                         "deterministic", CASES,
                         ids=[f"{c[0]}-b{c[1]}-q{c[2]}-k{c[3]}-h{c[4]}x{c[5]}-d{c[6]}-{c[7]}-{c[8]}"
                              f"{'-s' + str(c[9]) if c[9] else ''}{'-det' if c[10] else ''}" for c in CASES])
def test_matches_float64_reference(dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, mask, layout,
                                   scale, deterministic):
    generator = torch.Generator(device="cuda").manual_seed(seqlen_q * 1000 + seqlen_k)
    dt = _DTYPES[dtype]
    q = _randn(*_shape(layout, batch, seqlen_q, heads_q, head_dim), dtype=dt, generator=generator)
    k = _randn(*_shape(layout, batch, seqlen_k, heads_kv, head_dim), dtype=dt, generator=generator)
    v = _randn(*_shape(layout, batch, seqlen_k, heads_kv, head_dim), dtype=dt, generator=generator)
    dout = _randn(*q.shape, dtype=dt, generator=generator)
    _, _, dq, dk, dv = check_against_reference(q, k, v, dout, mask, layout, scale, deterministic)
    if deterministic:  # the same bits on a second run
        _, _, dq2, dk2, dv2 = run_flashgen(q, k, v, dout, mask, layout, scale, deterministic)
        assert torch.equal(dq, dq2) and torch.equal(dk, dk2) and torch.equal(dv, dv2)


def test_non_contiguous_inputs():
    generator = torch.Generator(device="cuda").manual_seed(7)
    bf16 = torch.bfloat16
    # Read in place: padded rows; a [b, s, h, d] view of [b, h, s, d] memory. Copied: head_dim strided; dout
    # with every other element.
    q = _randn(2, 100, 4, 72, dtype=bf16, generator=generator)[..., :64]
    k = _randn(2, 2, 140, 64, dtype=bf16, generator=generator).transpose(1, 2)
    v = _randn(2, 140, 64, 2, dtype=bf16, generator=generator).transpose(-1, -2)
    dout = _randn(2, 100, 4, 128, dtype=bf16, generator=generator)[..., ::2]
    check_against_reference(q, k, v, dout, "bottom_right", "bshd")

    # Copied: data 2 bytes past an aligned address. Read in place: k and v broadcast over the batch (stride 0),
    # q from a packed [b, s, 3, h, d] buffer in the bhsd layout.
    flat = _randn(1 + 2 * 4 * 90 * 64, dtype=bf16, generator=generator)
    q = flat[1:].view(2, 4, 90, 64)
    k = _randn(1, 2, 90, 64, dtype=bf16, generator=generator).expand(2, 2, 90, 64)
    packed = _randn(2, 90, 3, 2, 64, dtype=bf16, generator=generator)
    v = packed[:, :, 1].transpose(1, 2)
    dout = _randn(2, 4, 90, 64, dtype=bf16, generator=generator)
    check_against_reference(q, k, v, dout, "top_left", "bhsd")


def test_inputs_are_read_in_place_when_strides_allow():
    t = torch.randn(2, 50, 3, 4, 64, device="cuda").half()
    in_place = [t[:, :, 0], t[:, :, 1].transpose(1, 2), torch.randn(2, 50, 4, 72, device="cuda").half()[..., :64],
                torch.randn(1, 50, 4, 64, device="cuda").half().expand(3, 50, 4, 64)]
    for x in in_place:
        assert fg_calls._readable(x) is x, (x.shape, x.stride())
    copied = [torch.randn(2, 50, 64, 4, device="cuda").half().transpose(-1, -2),   # head_dim not unit-stride
              torch.randn(1 + 2 * 50 * 4 * 64, device="cuda").half()[1:].view(2, 50, 4, 64),  # misaligned
              torch.randn(2, 50, 4, 68, device="cuda").half()[..., :64]]  # row stride 68 not a multiple of 8
    for x in copied:
        y = fg_calls._readable(x)
        assert y is not x and y.is_contiguous() and y.data_ptr() % 16 == 0 and torch.equal(x, y)


def test_warm_backward_runs_through_its_plan(monkeypatch):
    """A second backward of one signature skips the argument checks through its kept arguments (_BackwardPlan),
    re-pointed at the call's own tensors: its gradients match the float64 reference and are bitwise those of the same
    call made cold (deterministic). A call whose data is not 16-byte aligned takes the full path (a copy). The plans
    are the ctypes backend's (with the op library the C++ kernel takes the call)."""
    if fgt.backend() == "native":
        pytest.skip("the op library serves the backward: no ctypes plans")
    generator = torch.Generator(device="cuda").manual_seed(11)
    shape = (2, 96, 4, 64)
    first, second = ([_randn(*shape, dtype=torch.bfloat16, generator=generator) for _ in range(4)] for _ in range(2))
    check_against_reference(*first, "bottom_right", "bshd", deterministic=True)
    checked = []
    real_check = fg_calls._check_inputs
    monkeypatch.setattr(fg_calls, "_check_inputs", lambda *a: checked.append(1) or real_check(*a))
    _, _, *warm = check_against_reference(*second, "bottom_right", "bshd", deterministic=True)
    assert not checked, "the warm backward took the checked path, not its plan"
    # The plans are kept per thread, the autograd engine's device thread's here: the cold run is told to have none.
    monkeypatch.setattr(fg_calls, "_planned_backward", lambda *a: None)
    _, _, *cold = run_flashgen(*second, "bottom_right", "bshd", None, True)
    assert checked
    monkeypatch.undo()
    monkeypatch.setattr(fg_calls, "_check_inputs", lambda *a: checked.append(1) or real_check(*a))
    assert all(torch.equal(w, c) for w, c in zip(warm, cold))
    checked.clear()
    flat = _randn(4 + 2 * 96 * 4 * 64, dtype=torch.bfloat16, generator=generator)
    misaligned = flat[4:].view(shape)  # 8 bytes past an aligned address
    check_against_reference(misaligned, *second[1:], "bottom_right", "bshd", deterministic=True)
    assert checked, "a misaligned call must take the full path"


def test_no_grad_and_return_lse():
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out = fgt.attention(q, k, v, causal=True)
    assert not out.requires_grad
    out, lse = fgt.attention(q, k, v, causal=True, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    # A loss through lse alone has no gradient (documented: lse is not differentiable).
    with pytest.raises(RuntimeError):
        lse.sum().backward()


def _expect_argument_error(match, *args, **kwargs):
    with pytest.raises(flashgen.FlashgenArgumentError, match=match) as caught:
        fgt.attention(*args, **kwargs)
    assert isinstance(caught.value, ValueError)
    return caught.value


def test_bad_arguments_raise_with_the_library_message():
    def t(*shape, dtype=torch.float16, device="cuda"):
        return torch.randn(*shape, device=device).to(dtype)

    q = t(1, 16, 2, 64)
    # Checked by the library: the message is flashgen's own, naming the dimension.
    error = _expect_argument_error(r"head_dim\) = 100 is unsupported", t(1, 16, 2, 100), t(1, 16, 2, 100),
                                   t(1, 16, 2, 100))
    assert error.status == 2 and "flashgen_attention_forward" in str(error)
    _expect_argument_error(r"q\.shape\[2\] \(heads\) = 6 must be a multiple of k\.shape\[2\] \(heads\) = 4",
                           t(1, 16, 6, 64), t(1, 16, 4, 64), t(1, 16, 4, 64))
    _expect_argument_error(r"v\.shape\[1\] \(seqlen\) is 17 but k\.shape\[1\] \(seqlen\) is 16", q, q, t(1, 17, 2, 64))
    _expect_argument_error(r"k\.shape\[0\] \(batch\) is 2", q, t(2, 16, 2, 64), t(2, 16, 2, 64))
    # Checked in Python, before anything reaches the library.
    _expect_argument_error(r"q\.dtype is torch\.float32", q.float(), q, q)
    _expect_argument_error(r"k\.dtype is torch\.bfloat16 but q\.dtype is torch\.float16", q, q.bfloat16(), q)
    _expect_argument_error(r"v is on cpu", q, q, q.cpu())
    _expect_argument_error(r"q: expected a 4-d tensor", q[0], q, q)
    _expect_argument_error(r"layout must be 'bshd'", q, q, q, layout="sbhd")
    _expect_argument_error(r"causal_align must be", q, q, q, causal=True, causal_align="bottom-right")
    _expect_argument_error(r"scale must be a positive finite number", q, q, q, scale=-1.0)
