"""flashgen.torch's MLA decoding over a latent cache: mla_decode_with_kvcache (FlashMLA's arguments) and
attention_with_kvcache with v_cache a view of k_cache's first columns. On any machine with torch: the output's shape
through the op's fake kernel (meta tensors) and the arguments refused, each named. On Hopper: out and lse against
float64 attention over the expanded latent (keys the whole rows, values their first head_dim_v columns) for paged and
contiguous caches, the q_pe form bitwise the joined q's, and new tokens appended as k alone.
"""

import pytest

import testsupport

_missing = testsupport.torch_missing()
if _missing:
    pytest.skip(f"flashgen.torch tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import FlashgenArgumentError  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def _lens(values, device="meta"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def test_the_output_takes_the_values_head_dim_through_the_fake_kernel():
    q, kv_cache = _meta(4, 1, 128, 576), _meta(40, 64, 1, 576)
    table = torch.zeros(4, 10, dtype=torch.int32, device="meta")
    out, lse = fgt.mla_decode_with_kvcache(q, kv_cache, table, _lens([1, 2, 3, 4]), causal=True)
    assert out.shape == (4, 1, 128, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (4, 128, 1) and lse.dtype == torch.float32
    alone = fgt.mla_decode_with_kvcache(q[..., :512], kv_cache, table, _lens([1, 2, 3, 4]), return_softmax_lse=False,
                                        q_pe=q[..., 512:])
    assert alone.shape == (4, 1, 128, 512)
    # attention_with_kvcache over a latent view, new tokens appended as k alone; an ordinary cache keeps q's dim.
    k_cache = _meta(2, 256, 2, 320)
    out = fgt.attention_with_kvcache(_meta(2, 3, 16, 320), k_cache, k_cache[..., :256], _meta(2, 3, 2, 320),
                                     cache_seqlens=_lens([3, 4]), causal=True)
    assert out.shape == (2, 3, 16, 256)
    assert fgt.attention_with_kvcache(_meta(2, 1, 8, 128), *(_meta(2, 64, 2, 128),) * 2).shape == (2, 1, 8, 128)


def test_bad_arguments_are_named():
    q, kv_cache, lens = _meta(2, 1, 16, 576), _meta(2, 128, 1, 576), _lens([5, 6])
    with pytest.raises(FlashgenArgumentError, match=r"head_dim_v = 576 must be below kv_cache.shape\[3\] \(head_dim\) "
                                                    r"= 576"):
        fgt.mla_decode_with_kvcache(q, kv_cache, None, lens, head_dim_v=576)
    with pytest.raises(FlashgenArgumentError, match="head_dim_v: expected an int, got float"):
        fgt.mla_decode_with_kvcache(q, kv_cache, None, lens, head_dim_v=512.0)
    with pytest.raises(FlashgenArgumentError, match="kv_cache: expected a 4-d tensor"):
        fgt.mla_decode_with_kvcache(q, kv_cache[0], None, lens)
    with pytest.raises(FlashgenArgumentError, match=r"q_pe: expected \[batch, seqlen_q, heads_q, head_dim - "
                                                    r"head_dim_v = 64\]"):
        fgt.mla_decode_with_kvcache(q[..., :512], kv_cache, None, lens, q_pe=_meta(2, 1, 16, 32))
    with pytest.raises(FlashgenArgumentError, match=r"q: with q_pe given, q is q_nope \[batch, seqlen_q, heads_q, "
                                                    r"head_dim_v = 512\]"):
        fgt.mla_decode_with_kvcache(q, kv_cache, None, lens, q_pe=q[..., 512:])
    with pytest.raises(FlashgenArgumentError, match=r"q_pe: its \[batch, seqlen_q, heads_q\] are \[2, 1, 8\]"):
        fgt.mla_decode_with_kvcache(q[..., :512], kv_cache, None, lens, q_pe=_meta(2, 1, 8, 64))
    # A latent cache takes its new tokens as k alone; an ordinary one takes k and v or neither.
    with pytest.raises(FlashgenArgumentError, match="v: a latent cache's new values are k's first 512 columns"):
        fgt.attention_with_kvcache(q, kv_cache, kv_cache[..., :512], _meta(2, 1, 1, 576), _meta(2, 1, 1, 512),
                                   cache_seqlens=lens)
    with pytest.raises(FlashgenArgumentError, match="k and v: give both"):
        fgt.attention_with_kvcache(q, kv_cache, kv_cache, _meta(2, 1, 1, 576), cache_seqlens=lens)


_gpu_missing = testsupport.gpu_missing()
if _gpu_missing is None and torch.cuda.get_device_capability() != (9, 0):
    _gpu_missing = f"{torch.cuda.get_device_name()} is not Hopper: the latent kernel runs on sm_90 only"
hopper = pytest.mark.skipif(_gpu_missing is not None, reason=f"needs an sm_90 GPU: {_gpu_missing}")


def _randn(*shape, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=generator).to(torch.bfloat16)


def _check(out, lse, q, latent, lens, head_dim_v, causal):
    """Sequence b's out and lse against float64 attention of its queries over latent[b, :lens[b]] (the keys), whose
    first head_dim_v columns are the values; causal aligned bottom-right."""
    seqlen_q, heads_q, head_dim = q.shape[1], q.shape[2], q.shape[3]
    for b, n in enumerate(lens):
        keys = latent[b:b + 1, :n]
        visible = testsupport.visible_keys(seqlen_q, n, "bottom_right" if causal else "none", q.device)
        dout = torch.zeros(1, seqlen_q, heads_q, head_dim_v, device="cuda")
        want, want_lse, _ = testsupport.float64_bshd_attention(q[b:b + 1], keys, keys[..., :head_dim_v], dout,
                                                               head_dim ** -0.5, visible)
        testsupport.assert_close_to_float64(f"out of sequence {b} ({n} keys)", out[b:b + 1], want, torch.bfloat16)
        assert testsupport.max_error(lse[b:b + 1], want_lse) <= 1e-3, f"lse of sequence {b}"


def _paged(latent, page_size, spare_pages, seed):
    """(kv_cache, block_table): latent [batch, capacity, heads_kv, head_dim] moved into pages of page_size rows in a
    shuffled order, among spare_pages pages of noise."""
    batch, capacity, heads_kv, head_dim = latent.shape
    pages = capacity // page_size
    order = torch.randperm(batch * pages + spare_pages, generator=torch.Generator().manual_seed(seed)).cuda()
    kv_cache = _randn(len(order), page_size, heads_kv, head_dim, seed=seed)
    kv_cache[order[:batch * pages]] = latent.reshape(batch * pages, page_size, heads_kv, head_dim)
    return kv_cache, order[:batch * pages].view(batch, pages).to(torch.int32)


@hopper
def test_deepseek_decode_over_a_paged_cache_matches_float64():
    """DeepSeek's decode step: 128 query heads of 576 columns over one latent head, one token, pages of 64 in a
    shuffled order, sequences of 1 to 1024 keys, chosen and fixed split counts."""
    batch, capacity, heads_q = 4, 1024, 128
    lens = [1, 700, 1024, 129]
    latent = _randn(batch, capacity, 1, 576, seed=1)
    kv_cache, table = _paged(latent, 64, 3, seed=2)
    q = _randn(batch, 1, heads_q, 576, seed=3)
    cache_seqlens = _lens(lens, device="cuda")
    for num_splits in (0, 1, 5):
        out, lse = fgt.mla_decode_with_kvcache(q, kv_cache, table, cache_seqlens, causal=True, num_splits=num_splits)
        assert out.shape == (batch, 1, heads_q, 512) and lse.shape == (batch, heads_q, 1)
        _check(out, lse, q, latent, lens, 512, causal=True)


@hopper
@pytest.mark.parametrize("head_dim,head_dim_v,heads_kv", [(576, 512, 1), (320, 256, 2)])
def test_speculative_tokens_over_a_contiguous_cache_match_float64(head_dim, head_dim_v, heads_kv):
    """Two new tokens per sequence, bottom-right causal, 16 query heads, a contiguous cache."""
    batch, capacity, heads_q = 3, 300, 16
    lens = [2, 150, 300]
    kv_cache = _randn(batch, capacity, heads_kv, head_dim, seed=10)
    q = _randn(batch, 2, heads_q, head_dim, seed=11)
    out, lse = fgt.mla_decode_with_kvcache(q, kv_cache, None, _lens(lens, device="cuda"), head_dim_v=head_dim_v,
                                           causal=True)
    assert out.shape == (batch, 2, heads_q, head_dim_v)
    _check(out, lse, q, kv_cache, lens, head_dim_v, causal=True)


@hopper
def test_the_q_pe_form_and_a_copied_q_give_the_joined_q_bits():
    """q_nope and q_pe give the bits of the joined q; so do a warm call through the signature's plan and a q the kernels
    cannot read in place (copied first, on the path without a plan)."""
    latent = _randn(2, 256, 1, 576, seed=20)
    kv_cache, table = _paged(latent, 64, 0, seed=21)
    lens = _lens([256, 77], device="cuda")
    q = _randn(2, 1, 64, 576, seed=22)

    def call(q, **extra):
        return fgt.mla_decode_with_kvcache(q, kv_cache, table, lens, num_splits=2, **extra)

    out, lse = call(q)
    split = call(q[..., :512].clone(), q_pe=q[..., 512:].clone())
    assert torch.equal(split[0], out) and torch.equal(split[1], lse)
    warm = call(q)
    assert torch.equal(warm[0], out) and torch.equal(warm[1], lse)
    wide = torch.zeros(2, 1, 64, 580, device="cuda", dtype=torch.bfloat16)
    wide[..., :576] = q
    unreadable = wide[..., :576]  # rows 580 elements apart: not a multiple of 8
    copied = call(unreadable)
    assert torch.equal(copied[0], out) and torch.equal(copied[1], lse)
    assert torch.equal(call(q, return_softmax_lse=False), out)


@hopper
@pytest.mark.parametrize("page_size", [0, 16])
def test_new_tokens_are_appended_as_k_alone(page_size):
    """attention_with_kvcache over a latent view with k given and v None: the new tokens' rows land in the cache after
    each sequence's cache_seqlens[b] keys, every other row unchanged, and the queries attend to them too."""
    batch, capacity, heads_q, new = 2, 256, 16, 2
    lens = [100, 37]
    latent = _randn(batch, capacity, 1, 576, seed=30)
    k_new = _randn(batch, new, 1, 576, seed=31)
    q = _randn(batch, new, heads_q, 576, seed=32)
    if page_size:
        k_cache, table = _paged(latent, page_size, 2, seed=33)
    else:
        k_cache, table = latent.clone(), None
    out, lse = fgt.attention_with_kvcache(q, k_cache, k_cache[..., :512], k_new, cache_seqlens=_lens(lens, "cuda"),
                                          block_table=table, causal=True, return_softmax_lse=True)
    assert out.shape == (batch, new, heads_q, 512)
    expected = latent.clone()
    for b, n in enumerate(lens):
        expected[b, n:n + new] = k_new[b]
    logical = k_cache if table is None else k_cache[table.flatten().long()].reshape(latent.shape)
    assert torch.equal(logical, expected)
    _check(out, lse, q, expected, [n + new for n in lens], 512, causal=True)
