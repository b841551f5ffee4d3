"""Shared by flashgen's Python tests: imports flashgen from this source tree, keeps the tests' tuning data out of
the user's database, says why torch, a GPU or the library is missing, and holds the float64 reference
(scaled_dot_product_attention with the MATH backend) with the tolerance rule the numeric tests use.
"""

import os
import pathlib
import sys
import tempfile

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
REPO_ROOT = PYTHON_DIR.parent


def setup_environment():
    """flashgen from python/ of this checkout; a fresh tuning database unless FLASHGEN_TUNING_DB is set (tune()
    writes to it, and the tests must not change the user's choices)."""
    if str(PYTHON_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHON_DIR))
    if "FLASHGEN_TUNING_DB" not in os.environ:
        folder = tempfile.mkdtemp(prefix="flashgen-python-tests-")
        os.environ["FLASHGEN_TUNING_DB"] = os.path.join(folder, "tuning.sqlite")


setup_environment()


def library_missing():
    """Why libflashgen cannot be used here, or None. With FLASHGEN_LIBRARY set (as CI sets it) a library that
    does not load is an error of the run, not a reason to skip, so this only skips when nothing was asked for."""
    import flashgen._lib as lib
    try:
        lib.load_library()
        return None
    except lib.FlashgenError as error:
        if os.environ.get("FLASHGEN_LIBRARY"):
            raise
        return str(error)


def torch_missing():
    """Why flashgen.torch cannot be used here (no torch, or one without torch.library.custom_op), or None."""
    try:
        import torch
    except ImportError as error:
        return f"no torch ({error})"
    if not hasattr(torch.library, "custom_op"):
        return f"torch {torch.__version__} has no torch.library.custom_op (flashgen.torch needs torch >= 2.4)"
    return None


def gpu_missing():
    """Why the GPU tests cannot run here, or None."""
    why = torch_missing()
    if why:
        return why
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if torch.cuda.get_device_capability() < (8, 0):
        return f"{torch.cuda.get_device_name()} is older than sm_80"
    return library_missing()


# -------------------------------------------------------------------------------------------------------------
# Numerics. Everything below imports torch lazily: this module is also loaded where torch is missing.

# Machine epsilon of each dtype: the smallest relative step of a stored value.
EPSILON = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def visible_keys(seqlen_q, seqlen_k, mask, device):
    """[seqlen_q, seqlen_k] bool: key j visible to query i (flashgen.h's alignments; "none" sees all)."""
    import torch
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    if mask == "none":
        return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    offset = seqlen_k - seqlen_q if mask == "bottom_right" else 0
    return j <= i + offset


def window_keys(seqlen_q, seqlen_k, window, device):
    """[seqlen_q, seqlen_k] bool: key j visible to query i under flashgen.h's sliding window (left, right): j from
    i + seqlen_k - seqlen_q - left to i + seqlen_k - seqlen_q + right, a side of -1 unbounded."""
    import torch
    left, right = window
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k, device=device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= j >= diagonal - left
    if right >= 0:
        visible &= j <= diagonal + right
    return visible


def chunk_keys(seqlen_q, seqlen_k, chunk, device):
    """[seqlen_q, seqlen_k] bool: key j visible to query i under flashgen.h's attention_chunk C > 0 (Llama 4's chunked
    attention): j lies in the chunk of C positions that holds the row's bottom-right diagonal, floor(j / C) ==
    floor((i + seqlen_k - seqlen_q) / C), so a row whose diagonal is negative sees no key; every key when chunk is 0."""
    import torch
    if chunk == 0:
        return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k, device=device)[None, :]
    return torch.div(j, chunk, rounding_mode="floor") == torch.div(diagonal, chunk, rounding_mode="floor")


def reversed_pages(k_logical, v_logical, page_size):
    """(block_table, k_cache, v_cache): caches [batch, capacity, heads_kv, head_dim] moved into pages of page_size
    rows laid out in reverse order ([num_pages, page_size, heads_kv, head_dim]), and the int32 [batch, pages] table
    that finds them."""
    import torch
    batch, capacity, heads_kv, head_dim = k_logical.shape
    order = torch.arange(batch * capacity // page_size, device=k_logical.device).flip(0)
    caches = []
    for logical in (k_logical, v_logical):
        cache = torch.empty(len(order), page_size, heads_kv, head_dim, device=logical.device, dtype=logical.dtype)
        cache[order] = logical.reshape(-1, page_size, heads_kv, head_dim)
        caches.append(cache)
    return order.view(batch, -1).to(torch.int32), caches[0], caches[1]


def float64_bshd_attention(q, k, v, dout, scale, visible=None, softcap=0.0, bias=None):
    """out, lse and (dq, dk, dv) in float64 for bshd q, k, v (GQA by repeating k and v): the softmax of the scores,
    each capped to softcap * tanh(s / softcap) when softcap > 0 and then given bias ([batch or 1, heads_q, seqlen_q,
    seqlen_k], when not None), over the keys `visible` shows ([seqlen_q, seqlen_k] bool; every key when None). Rows
    that see no key give out 0, lse -inf and no gradient, as flashgen's do."""
    import torch
    q64, k64, v64 = (t.double().detach().requires_grad_(True) for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kr, vr = (t.repeat_interleave(group, dim=2) for t in (k64, v64))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kr) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    if visible is None:
        visible = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device)
    live = visible.any(dim=-1)[:, None]
    # A row that sees no key takes finite scores, then weight 0: neither NaN nor a gradient reaches q or k.
    s = torch.where(live, s.masked_fill(~visible, float("-inf")), torch.zeros_like(s))
    lse = torch.logsumexp(s, dim=-1).masked_fill(~live[:, 0], float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1) * live, vr)
    out.backward(dout.double())
    return out.detach(), lse.detach(), (q64.grad, k64.grad, v64.grad)


def assert_close_to_float64(name, got, want, dtype):
    """|got - want| within a few roundings of the output's scale in dtype (bf16 holds 8 bits of mantissa, fp16 11),
    with the first mismatches in the message."""
    import torch
    allowed = (3e-2 if dtype == torch.bfloat16 else 4e-3) * max(want.abs().max().item(), 1.0)
    error = max_error(got, want)
    assert error <= allowed, mismatch_report(name, got, want, allowed)


def fill_pages(caches, packed, lens, table, page_size):
    """Writes each sequence's rows of the packed tensors (k, v, ...) into its pages of the caches [num_pages,
    page_size, heads, head_dim]: sequence b's row j into row j % page_size of page table[b, j // page_size]."""
    start = 0
    for b, n in enumerate(lens):
        for j in range(n):
            for cache, rows in zip(caches, packed):
                cache[table[b, j // page_size], j % page_size] = rows[start + j]
        start += n


def packed_offsets(lens):
    """int32 [len(lens) + 1] offsets on the GPU of packed sequences of these lengths (cu_seqlens)."""
    import torch
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def packed_gqa_batch(q_lens, k_lens, seed):
    """A packed bf16 batch on the GPU, 4 query heads over 2 kv heads of 64 columns: q, k, v (requiring grad), dout,
    cu_seqlens_q and cu_seqlens_k for sequences of q_lens queries and k_lens keys."""
    import torch
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(sum(lens), heads, 64, device="cuda", generator=generator).to(torch.bfloat16)
               .requires_grad_(True) for lens, heads in ((q_lens, 4), (k_lens, 2), (k_lens, 2)))
    dout = torch.randn(sum(q_lens), 4, 64, device="cuda", generator=generator).to(torch.bfloat16)
    return q, k, v, dout, packed_offsets(q_lens), packed_offsets(k_lens)


def check_packed_bf16_self_attention(seed, lens, attend, reference):
    """A packed bf16 self-attention batch of sequences of these lengths (2 heads of 64 columns, on the GPU): runs
    attend(q, k, v, cu_seqlens, max_seqlen) and backpropagates a random dout through it, then checks each sequence's
    rows of out and of the gradients against reference(q, k, v, dout) of that sequence alone ([1, n, 2, 64] views;
    (out, lse, (dq, dk, dv)) as float64_bshd_attention returns them)."""
    import torch
    generator = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, 2, 64, device="cuda", generator=generator).to(torch.bfloat16).requires_grad_(True)
               for _ in range(3))
    dout = torch.randn(total, 2, 64, device="cuda", generator=generator).to(torch.bfloat16)
    out = attend(q, k, v, cu, max(lens))
    out.backward(dout)
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        want, _, grads = reference(q[None, rows], k[None, rows], v[None, rows], dout[None, rows])
        assert_close_to_float64("out", out[None, rows], want, torch.bfloat16)
        for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
            assert_close_to_float64(name, tensor.grad[None, rows], want_grad, torch.bfloat16)
        start += n


def alibi_bias(slopes, seqlen_q, seqlen_k, top_left=False):
    """FlashAttention's ALiBi bias [batch or 1, heads_q, seqlen_q, seqlen_k] of slopes ([heads_q] or [batch,
    heads_q]): -slope * |i + seqlen_k - seqlen_q - j|, about i - j when top_left."""
    import torch
    i = torch.arange(seqlen_q, device=slopes.device)[:, None] + (0 if top_left else seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=slopes.device)[None, :]
    per_batch = slopes.double() if slopes.dim() == 2 else slopes.double()[None]
    return -per_batch[:, :, None, None] * (i - j).abs().double()


def to_bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


def from_bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


def sdpa_attention(q, k, v, dout, mask, scale, layout, dtype=None, backend=None):
    """scaled_dot_product_attention of q, k, v (in `layout`) and its gradients for dout, computed in `dtype`
    (default: the inputs' own) with `backend` (default: torch's choice), on the rows that see a key.

    Returns (out, lse, dq, dk, dv, live): out and the gradients in `layout`, zero on rows that see no key; lse
    float64 [batch, heads_q, seqlen_q] (-inf on those rows; computed from the scores, not by SDPA); live the
    [seqlen_q] bool of rows that see a key. Grouped heads are expanded with repeat_interleave, so the gradients
    of k and v sum over each group exactly as flashgen documents.
    """
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    dtype = dtype or q.dtype
    qb, kb, vb, doutb = (to_bhsd(t.detach(), layout).to(dtype) for t in (q, k, v, dout))
    qb, kb, vb = (t.clone().requires_grad_() for t in (qb, kb, vb))
    batch, heads_q, seqlen_q, head_dim = qb.shape
    group = heads_q // kb.shape[1]
    kx, vx = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
    visible = visible_keys(seqlen_q, kb.shape[2], mask, q.device)
    live = visible.any(dim=1)
    scale = scale or head_dim ** -0.5

    with torch.no_grad():
        scores = (qb.double() @ kx.double().transpose(-1, -2)) * scale
        lse = scores.masked_fill(~visible, float("-inf")).logsumexp(dim=-1)

    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        out_live = F.scaled_dot_product_attention(qb[:, :, live], kx, vx, attn_mask=visible[live], scale=scale)
    dq, dk, dv = torch.autograd.grad(out_live, (qb, kb, vb), doutb[:, :, live])
    out = torch.zeros(batch, heads_q, seqlen_q, head_dim, dtype=dtype, device=q.device)
    out[:, :, live] = out_live.detach()
    return (from_bhsd(out, layout), lse, from_bhsd(dq, layout), from_bhsd(dk, layout), from_bhsd(dv, layout),
            live)


def reference_attention(q, k, v, dout, mask, scale, layout):
    """The float64 reference: SDPA's MATH backend on the very values flashgen reads."""
    import torch
    from torch.nn.attention import SDPBackend
    return sdpa_attention(q, k, v, dout, mask, scale, layout, dtype=torch.float64, backend=SDPBackend.MATH)


def max_error(got, want):
    """max |got - want| in float64 (inf when got has a NaN where want has a number)."""
    import torch
    diff = (got.double() - want.double()).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return diff.max().item() if diff.numel() else 0.0


def tolerance(name, reference, torch_error, dtype_name, factor):
    """Allowed max |flashgen - float64 reference| for one tensor: `factor` times PyTorch's own attention error in
    the same dtype (what a torch user already accepts), plus one epsilon of the dtype at the reference's scale
    (a last-bit rounding difference of the largest value)."""
    del name
    return factor * torch_error + EPSILON[dtype_name] * reference.abs().max().item()


def mismatch_report(name, got, want, allowed, limit=5):
    """The first `limit` elements of got outside want ± allowed, for an assertion message."""
    import torch
    diff = (got.double() - want.double()).abs()
    bad = torch.nonzero(~(diff <= allowed))[:limit]
    lines = [f"{name}: max |diff| {max_error(got, want):.3g} > allowed {allowed:.3g}; first mismatches:"]
    for index in bad.tolist():
        lines.append(f"  {name}{index}: got {got[tuple(index)].item():.6g}, want {want[tuple(index)].item():.6g}")
    return "\n".join(lines)


def poison_allocator(device, *byte_counts):
    """Best effort at making unwritten outputs visible: fills freshly allocated blocks of these sizes with NaN
    (0xFF bytes) and frees them, so the caching allocator hands the same blocks to the next allocations of those
    sizes (flashgen's outputs, which the tests cannot fill themselves)."""
    import torch
    blocks = [torch.full((max(1, n),), 0xFF, dtype=torch.uint8, device=device) for n in byte_counts]
    del blocks
