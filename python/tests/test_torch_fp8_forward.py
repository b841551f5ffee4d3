"""flashgen.torch.attention over FP8 q, k and v (torch.float8_e4m3fn, torch.float8_e5m2) with FlashAttention-3's
q_descale, k_descale and v_descale and a bf16 or fp16 out_dtype. On any machine with torch: the outputs' dtypes and
shapes through the fake kernel, and the refusals, each named, through meta tensors (descales with 16-bit inputs, of the
wrong dtype, device or shape, mixed formats, out_dtype, inputs that require grad, a user variant). On a GPU: the same
refusals of real tensors, the op's own. On sm_90: out and lse against float64 attention over the dequantized inputs
(codes.double() * descale, q's per its kv head) judged by FlashAttention-3's rule as
tests/launch/test_attention_fp8_gpu.cpp judges them (the largest error at most twice that of a float64 computation
rounding P to e4m3 as P * 2^8 against the row's max, plus two ulp of the output type at the largest |out|); causal and
not, both alignments (rows that see no key), GQA, MQA and MHA, both layouts, per-(batch, kv head), per-kv-head,
expanded-scalar and no descales, both output dtypes, both formats; warm calls through their plans beside 16-bit calls
of the same shapes, a view the kernels cannot read in place, and torch.compile's graph.
"""

import pytest

import testsupport

_missing = testsupport.torch_missing()
if _missing:
    pytest.skip(f"flashgen.torch tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _calls as fg_calls, _dense as fg_dense  # noqa: E402
from flashgen.torch import FlashgenArgumentError  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# The largest finite value of each format: where the codes saturate (torch's cast gives NaN or inf past it).
_FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


def _meta(*shape, dtype=E4M3):
    return torch.empty(shape, device="meta", dtype=dtype)


def test_fp8_outputs_take_out_dtype_through_the_fake_kernel():
    q, k = _meta(2, 64, 8, 128), _meta(2, 96, 2, 128)
    per_entry = _meta(2, 2, dtype=torch.float32)
    out, lse = fgt.attention(q, k, k, causal=True, q_descale=per_entry, k_descale=per_entry, v_descale=per_entry,
                             return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == torch.bfloat16  # FlashAttention-3's
    assert lse.shape == (2, 8, 64) and lse.dtype == torch.float32
    assert fgt.attention(q, k, k, out_dtype=torch.float16).dtype == torch.float16
    assert fgt.attention(q, k, k, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    # Descales of any shape that broadcasts to [batch, heads_kv]: a scalar expanded with zero strides (vLLM's and
    # SGLang's), the scalar itself, [heads_kv], [batch, 1], [1, heads_kv], [1].
    scalar = _meta(dtype=torch.float32)
    for descale in (scalar.expand(2, 2), scalar, _meta(2, dtype=torch.float32), _meta(2, 1, dtype=torch.float32),
                    _meta(1, 2, dtype=torch.float32), _meta(1, dtype=torch.float32)):
        assert fgt.attention(q, k, k, q_descale=descale, k_descale=descale, v_descale=descale).shape == q.shape
    # SDPA's layout, and e5m2.
    qb, kb = _meta(2, 8, 64, 128, dtype=E5M2), _meta(2, 2, 96, 128, dtype=E5M2)
    out = fgt.attention(qb, kb, kb, layout="bhsd", k_descale=_meta(2, 2, dtype=torch.float32), out_dtype=torch.float16)
    assert out.shape == qb.shape and out.dtype == torch.float16
    # The op itself, as torch.compile's graphs call it: out_dtype "" is bfloat16 for FP8 inputs, q's for 16-bit ones.
    out, lse = torch.ops.flashgen.attention_forward(q, k, k, 0.0, "none", "bshd", False, out_dtype="float16")
    assert out.dtype == torch.float16 and lse.shape == (2, 8, 64)
    assert torch.ops.flashgen.attention_forward(q, k, k, 0.0, "none", "bshd", False)[0].dtype == torch.bfloat16
    with pytest.raises(FlashgenArgumentError, match="out_dtype must be 'bfloat16' or 'float16' .* got 'float32'"):
        torch.ops.flashgen.attention_forward(q, k, k, 0.0, "none", "bshd", False, out_dtype="float32")
    q16 = _meta(2, 64, 8, 128, dtype=torch.float16)
    assert torch.ops.flashgen.attention_forward(q16, q16, q16, 0.0, "none", "bshd", False)[0].dtype == torch.float16
    # Empty inputs give zeros of out_dtype without a kernel.
    assert fgt.attention(_meta(2, 0, 8, 128), k, k, out_dtype=torch.float16).dtype == torch.float16


def test_fp8_refusals_are_named():
    q8, k8 = _meta(2, 64, 8, 128), _meta(2, 96, 2, 128)
    q16, k16 = _meta(2, 64, 8, 128, dtype=torch.bfloat16), _meta(2, 96, 2, 128, dtype=torch.bfloat16)
    one = _meta(2, 2, dtype=torch.float32)
    # Descales are the FP8 forward's: with 16-bit inputs each is refused by name.
    for name in ("q_descale", "k_descale", "v_descale"):
        with pytest.raises(FlashgenArgumentError, match=rf"{name}: given for 16-bit q, k and v \(q.dtype is "
                                                        r"torch.bfloat16\); descales are an FP8 forward's"):
            fgt.attention(q16, k16, k16, **{name: one})
    wrong_dtype = r"k_descale must be float32 of shape \[batch, heads_kv\] = \[2, 2\] or one that broadcasts to it "
    with pytest.raises(FlashgenArgumentError, match=wrong_dtype + r".*got torch.float16 \[2, 2\]"):
        fgt.attention(q8, k8, k8, k_descale=_meta(2, 2, dtype=torch.float16))
    for shape in ((3,), (2, 3), (4, 2), (1, 2, 2)):  # none broadcasts to [batch, heads_kv] = [2, 2]
        with pytest.raises(FlashgenArgumentError, match=r"v_descale must be float32 of shape \[batch, heads_kv\]"):
            fgt.attention(q8, k8, k8, v_descale=_meta(*shape, dtype=torch.float32))
    with pytest.raises(FlashgenArgumentError, match=r"q_descale must be on meta \(q's device\), got cpu"):
        fgt.attention(q8, k8, k8, q_descale=torch.ones(2, 2))
    with pytest.raises(FlashgenArgumentError, match="q_descale must be a torch.Tensor or None, got float"):
        fgt.attention(q8, k8, k8, q_descale=0.5)
    # One format for q, k and v; FP8 with 16-bit.
    with pytest.raises(FlashgenArgumentError, match=r"k.dtype is torch.float8_e5m2 but q.dtype is "
                                                    r"torch.float8_e4m3fn \(FP8 q, k and v share one format\)"):
        fgt.attention(q8, _meta(2, 96, 2, 128, dtype=E5M2), k8)
    with pytest.raises(FlashgenArgumentError, match=r"v.dtype is torch.bfloat16 but q.dtype is torch.float8_e4m3fn"):
        fgt.attention(q8, k8, k16)
    with pytest.raises(FlashgenArgumentError, match=r"k.dtype is torch.float8_e4m3fn; flashgen runs"):
        fgt.attention(q16, k8, k8)
    # out_dtype: bf16 or fp16 for FP8 inputs; 16-bit ones give out of their own dtype.
    with pytest.raises(FlashgenArgumentError, match=r"out_dtype must be torch.bfloat16 or torch.float16 \(or None\), "
                                                    r"got torch.float32"):
        fgt.attention(q8, k8, k8, out_dtype=torch.float32)
    with pytest.raises(FlashgenArgumentError, match="out_dtype must be torch.bfloat16 or torch.float16"):
        fgt.attention(q8, k8, k8, out_dtype="bfloat16")
    with pytest.raises(FlashgenArgumentError, match=r"out_dtype: 16-bit q, k and v give out in their own dtype "
                                                    r"\(q.dtype is torch.bfloat16\), got torch.float16"):
        fgt.attention(q16, k16, k16, out_dtype=torch.float16)
    assert fgt.attention(q16, k16, k16, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    # Forward only: inputs that would record autograd are refused, each named; under no_grad they run.
    for name in ("q", "k", "v"):
        inputs = {"q": q8, "k": k8, "v": k8}
        inputs[name] = inputs[name].clone().requires_grad_()
        with pytest.raises(FlashgenArgumentError, match=rf"flashgen.torch.attention: {name} requires grad, but the FP8 "
                                                        r"forward has no backward"):
            fgt.attention(inputs["q"], inputs["k"], inputs["v"])
        with torch.no_grad():
            assert not fgt.attention(inputs["q"], inputs["k"], inputs["v"]).requires_grad
    sinks = _meta(8, dtype=torch.float32).requires_grad_()
    with pytest.raises(FlashgenArgumentError, match="sinks requires grad, but the FP8 forward has no backward"):
        fgt.attention(q8, k8, k8, sinks=sinks)
    # The op itself refuses to record autograd too (its C++ autograd, or the Python formula's context).
    with pytest.raises(RuntimeError, match="the FP8 forward has no backward"):
        torch.ops.flashgen.attention_forward(q8.clone().requires_grad_(), k8, k8, 0.0, "none", "bshd", False)
    # No user variant with FP8 inputs.
    with pytest.raises(FlashgenArgumentError, match="FP8 q, k and v do not take a user variant"):
        fgt.attention(q8, k8, k8, mask_mod="return true;")
    # 16-bit inputs: still float16 and bfloat16 only, the FP8 ones named in the message.
    with pytest.raises(FlashgenArgumentError, match=r"q.dtype is torch.float32; flashgen runs torch.float16 and "
                                                    r"torch.bfloat16"):
        fgt.attention(_meta(2, 64, 8, 128, dtype=torch.float32), k16, k16)


_gpu_missing = testsupport.gpu_missing()
gpu = pytest.mark.skipif(_gpu_missing is not None, reason=f"GPU tests skipped: {_gpu_missing}")
_sm90_missing = _gpu_missing
if _sm90_missing is None and torch.cuda.get_device_capability() != (9, 0):
    _sm90_missing = f"{torch.cuda.get_device_name()} is not sm_90 (the FP8 forward runs on Hopper)"
sm90 = pytest.mark.skipif(_sm90_missing is not None, reason=f"FP8 forward tests skipped: {_sm90_missing}")


def _codes(shape, fmt, width, seed):
    """FP8 codes [batch, seqlen, heads, head_dim] of about N(0, width) on the GPU, saturated at the format's largest
    value (torch's cast does not saturate)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, device="cuda", generator=generator) * width
    return x.clamp(-_FP8_MAX[fmt], _FP8_MAX[fmt]).to(fmt)


def _descale(kind, batch, heads_kv, width, which, factor=1.0):
    """A descale that brings codes of about width to about factor, a different one for each tensor (which: 0 for q, 1
    for k, 2 for v): "entry" [batch, heads_kv] from a transposed tensor (its own strides), one per (batch entry, kv
    head); "scalar" one value expanded to [batch, heads_kv] with zero strides, as vLLM passes it; "head" [heads_kv];
    "none" None (1)."""
    if kind == "none":
        return None
    base = factor * 1.2 / width
    if kind == "scalar":
        return torch.tensor(base * (1.0 + 0.125 * which), device="cuda").expand(batch, heads_kv)
    spread = 1.0 + 0.125 * (torch.arange(batch * heads_kv, device="cuda", dtype=torch.float32) + which)
    if kind == "head":
        return (base * spread[:heads_kv]).contiguous()
    return (base * spread).view(heads_kv, batch).t()


def _bshd(t, layout):
    return t if layout == "bshd" else t.transpose(1, 2)


def _reference(q, k, v, descales, mask):
    """float64 attention over bshd FP8 q, k and v dequantized (each code times its descale, q's per the kv head its
    query head reads): (out [b, sq, hq, d], lse [b, hq, sq] (-inf where a row sees no key), magnitude [b, hq, sq]
    (the largest sum of |q·k| products over a row's visible keys, scaled: what the FP8 tensor cores' accumulation of
    S may lose 2^-11 of), out_p8 (out with P rounded to e4m3 as P * 2^8 against the row's max, its sum unrounded:
    the kernels' form)). The default scale, 1/sqrt(head_dim)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5

    def dequantized(t, descale):
        factor = (torch.ones(batch, heads_kv, dtype=torch.float64, device=t.device) if descale is None
                  else descale.expand(batch, heads_kv).double())
        factor = factor.repeat_interleave(t.shape[2] // heads_kv, dim=1)  # q: its query heads per kv head
        return t.double() * factor[:, None, :, None]

    qd, kd, vd = (dequantized(t, d) for t, d in zip((q, k, v), descales))
    kr, vr = (t.repeat_interleave(heads_q // heads_kv, dim=2) for t in (kd, vd))
    visible = testsupport.visible_keys(seqlen_q, seqlen_k, mask, q.device)
    s = (torch.einsum("bqhd,bkhd->bhqk", qd, kr) * scale).masked_fill(~visible, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    live = torch.isfinite(row_max)
    p = torch.exp(s - torch.where(live, row_max, torch.zeros_like(row_max)))  # 0 on hidden keys and dead rows
    total = torch.where(live, p.sum(dim=-1, keepdim=True), torch.ones_like(row_max))
    p8 = (p * 256.0).float().to(E4M3).double() / 256.0
    out, out_p8 = (torch.einsum("bhqk,bkhd->bqhd", w / total, vr) for w in (p, p8))
    lse = (row_max + torch.log(total))[..., 0]
    products = torch.einsum("bqhd,bkhd->bhqk", qd.abs(), kr.abs()) * scale
    magnitude = products.masked_fill(~visible, 0.0).amax(dim=-1)
    return out, lse, magnitude, out_p8


def _check_fa3_rule(name, out, lse, reference, out_dtype):
    """out (bshd) and lse against _reference's by FlashAttention-3's rule, tests/launch/test_attention_fp8_gpu.cpp's."""
    want, want_lse, magnitude, want_p8 = reference
    assert out.dtype == out_dtype and out.shape == want.shape, f"{name}: out {out.dtype} {tuple(out.shape)}"
    error, error_p8 = testsupport.max_error(out, want), testsupport.max_error(want_p8, want)
    largest = want.abs().max().item()
    ulp = largest * (2.0 ** -7 if out_dtype == torch.bfloat16 else 2.0 ** -10)
    allowed = 2 * error_p8 + 2 * ulp
    assert error <= allowed, (testsupport.mismatch_report(f"{name}: out", out, want, allowed) +
                              f"\n(a float64 P rounded to e4m3 errs by {error_p8:.3g}; ulp {ulp:.3g} at |out| "
                              f"{largest:.3g})")
    dead = torch.isneginf(want_lse)
    assert bool(torch.isneginf(lse[dead]).all()), f"{name}: rows that see no key must give lse -inf"
    bound = 1e-3 + magnitude * 2.0 ** -11
    outside = ~dead & ~((lse.double() - want_lse).abs() <= bound)
    if bool(outside.any()):
        b, h, i = torch.nonzero(outside)[0].tolist()
        pytest.fail(f"{name}: {int(outside.sum())} lse rows outside their bound; lse[{b}, {h}, {i}] is "
                    f"{lse[b, h, i].item():.6g}, want {want_lse[b, h, i].item():.6g} (|q·k| products "
                    f"{magnitude[b, h, i].item():.4g})")


# (format, out_dtype (None: the default, bf16), batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, mask, layout,
# descales' kind, code width)
_CASES = [
    pytest.param(E4M3, None, 2, 300, 300, 4, 2, 128, "bottom_right", "bshd", "entry", 150.0,
                 id="e4m3-d128-gqa-causal-entry-bf16"),
    pytest.param(E4M3, torch.float16, 1, 129, 500, 3, 3, 64, "none", "bhsd", "scalar", 150.0,
                 id="e4m3-d64-mha-nomask-scalar-fp16-bhsd"),
    pytest.param(E5M2, torch.bfloat16, 2, 300, 300, 4, 2, 128, "bottom_right", "bshd", "head", 150.0,
                 id="e5m2-d128-gqa-causal-head-bf16"),
    pytest.param(E5M2, torch.float16, 1, 300, 100, 4, 1, 128, "bottom_right", "bshd", "entry", 150.0,
                 id="e5m2-d128-mqa-causal-rows-see-none-fp16"),
    pytest.param(E4M3, torch.bfloat16, 2, 200, 333, 4, 2, 64, "top_left", "bshd", "none", 1.0,
                 id="e4m3-d64-gqa-top-left-no-descales-bf16"),
]


@sm90
@pytest.mark.parametrize("fmt,out_dtype,batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,mask,layout,kind,width",
                         _CASES)
def test_fp8_forward_matches_float64_by_flash_attention_3s_rule(fmt, out_dtype, batch, seqlen_q, seqlen_k, heads_q,
                                                                heads_kv, head_dim, mask, layout, kind, width):
    q = _codes((batch, seqlen_q, heads_q, head_dim), fmt, width, seed=1)
    k = _codes((batch, seqlen_k, heads_kv, head_dim), fmt, width, seed=2)
    v = _codes((batch, seqlen_k, heads_kv, head_dim), fmt, width, seed=3)
    descales = tuple(_descale(kind, batch, heads_kv, width, which) for which in range(3))
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    testsupport.poison_allocator(q.device, batch * seqlen_q * heads_q * head_dim * 2)
    out, lse = fgt.attention(q, k, v, causal=mask != "none", causal_align="top_left" if mask == "top_left"
                             else "bottom_right", layout=layout, return_lse=True, q_descale=descales[0],
                             k_descale=descales[1], v_descale=descales[2], out_dtype=out_dtype)
    assert out.shape == q.shape and lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    assert out.grad_fn is None and not out.requires_grad
    reference = _reference(*(_bshd(t, layout) for t in (q, k, v)), descales, mask)
    _check_fa3_rule(f"{fmt} {mask} {layout} {kind}", _bshd(out, layout), lse, reference,
                    out_dtype or torch.bfloat16)


@sm90
def test_warm_calls_take_their_own_plans_in_each_format(monkeypatch):
    """Calls of one shape and strides in every format one after another: a 16-bit call's plan, then e4m3 calls
    (cold, then warm through their plan with other descales of the same layout: bitwise a cold call's), an fp16
    output, e5m2 codes, and the 16-bit call again, each correct for its own format. A view whose strides are no
    multiples of 16 bytes is copied first (16-bit strides would be read in place): the bits of its contiguous copy."""
    batch, seqlen, heads_q, heads_kv, head_dim = 2, 256, 4, 2, 128
    generator = torch.Generator(device="cuda").manual_seed(20)
    q16, k16, v16 = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=generator)
                     .to(torch.bfloat16) for heads in (heads_q, heads_kv, heads_kv))
    with torch.no_grad():
        want16 = fgt.attention(q16, k16, v16, causal=True)
        assert torch.equal(fgt.attention(q16, k16, v16, causal=True), want16)  # through its plan
    shapes = ((batch, seqlen, heads_q, head_dim), (batch, seqlen, heads_kv, head_dim), (batch, seqlen, heads_kv,
                                                                                          head_dim))
    e4m3 = tuple(_codes(shape, E4M3, 150.0, seed=21 + i) for i, shape in enumerate(shapes))
    e5m2 = tuple(_codes(shape, E5M2, 150.0, seed=24 + i) for i, shape in enumerate(shapes))
    first = tuple(_descale("entry", batch, heads_kv, 150.0, which) for which in range(3))
    second = tuple(_descale("entry", batch, heads_kv, 150.0, which, factor=1.5) for which in range(3))
    checked = []
    real_check = fg_dense._check_inputs
    monkeypatch.setattr(fg_dense, "_check_inputs", lambda *a: checked.append(1) or real_check(*a))

    def call(codes, descales, out_dtype=None):
        return fgt.attention(*codes, causal=True, return_lse=True, q_descale=descales[0], k_descale=descales[1],
                             v_descale=descales[2], out_dtype=out_dtype)

    def reference(codes, descales):
        return _reference(*codes, descales, "bottom_right")

    cold = call(e4m3, first)
    assert checked, "a new FP8 signature must take the checked path"
    _check_fa3_rule("e4m3 after a bf16 call of the same shapes", *cold, reference(e4m3, first), torch.bfloat16)
    checked.clear()
    warm = call(e4m3, second)
    assert not checked, "the warm FP8 call took the checked path, not its plan"
    _check_fa3_rule("e4m3 warm, other descales", *warm, reference(e4m3, second), torch.bfloat16)
    fg_calls._plans.forward.clear()
    again = call(e4m3, second)
    assert checked and torch.equal(warm[0], again[0]) and torch.equal(warm[1], again[1])
    half = call(e4m3, second, out_dtype=torch.float16)
    _check_fa3_rule("e4m3, fp16 out", *half, reference(e4m3, second), torch.float16)
    _check_fa3_rule("e5m2 of the same shapes", *call(e5m2, first), reference(e5m2, first), torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fgt.attention(q16, k16, v16, causal=True), want16)
    # Rows of 136 FP8 codes: strides of 136 bytes, not multiples of 16.
    wide = _codes((batch, seqlen, heads_q, head_dim + 8), E4M3, 150.0, seed=30)
    narrow = wide[..., :head_dim]
    got = call((narrow, *e4m3[1:]), first)
    want = call((narrow.contiguous(), *e4m3[1:]), first)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@sm90
def test_torch_compile_keeps_an_fp8_call_in_its_graph():
    """Under torch.compile(fullgraph=True) the call is the op flashgen::attention_forward with its descales (a scalar
    expanded with zero strides as vLLM passes q_descale, per-(batch, kv head) ones for k and v) and out_dtype: out
    (fp16) and lse equal eager's bit for bit."""
    torch._dynamo.reset()
    batch, seqlen, heads_q, heads_kv, head_dim = 2, 192, 8, 2, 128
    q, k, v = (_codes((batch, seqlen, heads, head_dim), E4M3, 150.0, seed=40 + i)
               for i, heads in enumerate((heads_q, heads_kv, heads_kv)))
    q_descale = _descale("scalar", batch, heads_kv, 150.0, 0)
    k_descale, v_descale = (_descale("entry", batch, heads_kv, 150.0, which) for which in (1, 2))

    def step(q, k, v):
        return fgt.attention(q, k, v, causal=True, return_lse=True, q_descale=q_descale, k_descale=k_descale,
                             v_descale=v_descale, out_dtype=torch.float16)

    eager = step(q, k, v)
    compiled = torch.compile(step, fullgraph=True)(q, k, v)
    assert compiled[0].dtype == torch.float16 and compiled[1].dtype == torch.float32
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    _check_fa3_rule("compiled", *compiled, _reference(q, k, v, (q_descale, k_descale, v_descale), "bottom_right"),
                    torch.float16)


@sm90
def test_head_dims_the_fp8_forward_does_not_take_are_refused_by_the_library():
    q = _codes((1, 64, 2, 72), E4M3, 10.0, seed=50)
    with pytest.raises(FlashgenArgumentError, match="the FP8 forward takes multiples of 16"):
        fgt.attention(q, q, q)


@gpu
def test_gpu_refusals_name_the_argument():
    q8 = _codes((1, 64, 2, 64), E4M3, 10.0, seed=60)
    with pytest.raises(FlashgenArgumentError, match=r"k.dtype is torch.float8_e5m2 but q.dtype is "
                                                    r"torch.float8_e4m3fn \(FP8 q, k and v share one format\)"):
        fgt.attention(q8, q8.view(torch.uint8).view(E5M2), q8)
    with pytest.raises(FlashgenArgumentError, match=r"q_descale must be on cuda:\d \(q's device\), got cpu"):
        fgt.attention(q8, q8, q8, q_descale=torch.ones(()))
    qg = q8.clone().requires_grad_()
    with pytest.raises(FlashgenArgumentError, match="q requires grad, but the FP8 forward has no backward"):
        fgt.attention(qg, q8, q8, causal=True)
    # The op itself, as torch.compile's graphs call it, checks them too (in C++ or in Python) before any kernel.
    q16 = q8.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="q_descale: given for 16-bit q, k and v"):
        torch.ops.flashgen.attention_forward(q16, q16, q16, 0.0, "none", "bshd", False,
                                             q_descale=torch.ones(1, 1, device="cuda"))
    with pytest.raises(RuntimeError, match="k_descale must be float32 of shape"):
        torch.ops.flashgen.attention_forward(q8, q8, q8, 0.0, "none", "bshd", False,
                                             k_descale=torch.ones(3, device="cuda"))
    with pytest.raises(RuntimeError, match="out_dtype must be 'bfloat16' or 'float16' .* got 'float32'"):
        torch.ops.flashgen.attention_forward(q8, q8, q8, 0.0, "none", "bshd", False, out_dtype="float32")
    with pytest.raises(RuntimeError, match="out_dtype: 16-bit q, k and v give out in their own dtype"):
        torch.ops.flashgen.attention_forward(q16, q16, q16, 0.0, "none", "bshd", False, out_dtype="float16")
    # A 16-bit call naming its own dtype stays differentiable.
    q16 = q16.clone().requires_grad_()
    out = fgt.attention(q16, q16, q16, causal=True, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.grad_fn is not None
