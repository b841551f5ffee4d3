"""flashgen as a Hugging Face transformers attention implementation: register() adds it to transformers'
AttentionInterface and AttentionMaskInterface under the name "fg_attention", then

    import flashgen.transformers
    name = flashgen.transformers.register()                       # "fg_attention"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name, dtype=torch.bfloat16)

The name holds no "flash": transformers (5.x) takes any implementation name containing "flash" for a
FlashAttention package or a Hub kernel to import, and refuses one it cannot import.

What each call becomes: a padded batch (the 2-d padding mask that the registered mask function passes through) is
unpadded into a packed variable-length call and padded back; packed sequences (one row whose position_ids restart at
0, or transformers' cu_seq_lens_q/k arguments) are a variable-length call; generation's steps without padding (up to
16 new queries against a longer cache, no gradient) run the KV-cache decode kernels on the cache as transformers
keeps it; anything else is a dense call. Causal masks are aligned bottom-right, so generation with a KV cache
(queries after the cached keys) needs nothing else; sliding windows (Mistral, Gemma), logit soft caps (Gemma 2) and
attention sinks (gpt-oss, s_aux) are passed on. Training works through flashgen.torch's autograd. Dropout is refused
(flashgen has none: set the config's attention_dropout to 0). stats() counts the calls of each kind.
"""

import collections
import threading

import torch

from . import torch as _flashgen_torch
from ._lib import ERROR_INVALID_ARGUMENT, FlashgenArgumentError

NAME = "fg_attention"

# Calls with at most this many queries against a longer cache (generation's steps, speculative tokens) and no
# gradient run the KV-cache decode kernels.
_DECODE_MAX_QUERIES = 16

_counts = collections.Counter()
_counts_lock = threading.Lock()


def _count(kind):
    with _counts_lock:
        _counts[kind] += 1


def stats():
    """{"dense": n, "padded": n, "packed": n, "decode": n}: the calls of each kind since the process started (or
    reset_stats())."""
    with _counts_lock:
        return dict(_counts)


def reset_stats():
    with _counts_lock:
        _counts.clear()


def _window(sliding_window, key_length):
    """flashgen's window_size of transformers' sliding_window (a row sees its own key and the sliding_window - 1
    keys before it), or no window where every key lies inside it anyway."""
    if sliding_window is None or sliding_window <= 0 or key_length <= sliding_window:
        return (-1, -1)
    return (int(sliding_window) - 1, 0)


def _offsets(lengths):
    """int32 [n + 1] offsets of sequences of these lengths (an int32 [n] tensor) and the longest length."""
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets, int(lengths.max().item())


def _packed_offsets(position_ids):
    """(offsets, longest) of the sequences packed in one row whose position_ids restart at 0 at each sequence, or
    None when position_ids is not such a row (absent, a batch of several rows, or one sequence)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    positions = position_ids[0]
    starts = torch.nonzero(positions == 0).flatten()
    if starts.numel() <= 1 or starts[0].item() != 0:  # one sequence (or none starting at 0): a dense call
        return None
    ends = torch.cat([starts[1:], starts.new_tensor([positions.numel()])])
    return _offsets((ends - starts).to(torch.int32))


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, **kwargs):
    """transformers' attention function: query [batch, heads_q, q_len, head_dim], key and value [batch, heads_kv,
    kv_len, head_dim] (the cache included), attention_mask the 2-d [batch, kv_len] padding mask or None; returns
    (out [batch, q_len, heads_q, head_dim], None)."""
    if dropout and module.training:
        raise FlashgenArgumentError(
            f"flashgen has no attention dropout (this call asks for {dropout}): set the model config's "
            "attention_dropout to 0.0, or use another attn_implementation for training with dropout",
            ERROR_INVALID_ARGUMENT)
    if kwargs.get("output_attentions"):
        raise FlashgenArgumentError("flashgen does not return attention weights (output_attentions=True)",
                                    ERROR_INVALID_ARGUMENT)
    batch, heads_q, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    common = dict(softmax_scale=scaling, causal=bool(causal), softcap=softcap or 0.0,
                  window_size=_window(sliding_window, kv_len), sinks=kwargs.get("s_aux"))
    # [batch, seqlen, heads, head_dim] views of the caller's tensors: the library reads them through their strides.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))

    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        _count("padded")
        keep_k = attention_mask.bool()
        keep_q = keep_k[:, -q_len:]
        cu_k, max_k = _offsets(keep_k.sum(1, dtype=torch.int32))
        cu_q, max_q = _offsets(keep_q.sum(1, dtype=torch.int32))
        rows_k = torch.nonzero(keep_k.flatten()).flatten()
        rows_q = torch.nonzero(keep_q.flatten()).flatten()
        k_packed, v_packed = (t.reshape(batch * kv_len, -1, head_dim).index_select(0, rows_k) for t in (k, v))
        q_packed = q.reshape(batch * q_len, heads_q, head_dim).index_select(0, rows_q)
        out_packed = _flashgen_torch.varlen_attention(q_packed, k_packed, v_packed, cu_q, cu_k, max_q, max_k,
                                                      **common)
        out = out_packed.new_zeros(batch * q_len, heads_q, head_dim).index_copy(0, rows_q, out_packed)
        return out.view(batch, q_len, heads_q, head_dim), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None and batch == 1:
        max_q = kwargs.get("max_length_q", kwargs.get("max_seqlen_q"))
        max_k = kwargs.get("max_length_k", kwargs.get("max_seqlen_k"))
        lengths_q, lengths_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
        max_q = int(max_q) if max_q is not None else int(lengths_q.max().item())
        max_k = int(max_k) if max_k is not None else int(lengths_k.max().item())
        packed = (cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k)
    else:
        packed = _packed_offsets(kwargs.get("position_ids")) if batch == 1 and q_len == kv_len else None
        if packed is not None:
            packed = (packed[0], packed[0], packed[1], packed[1])
    if packed is not None:
        _count("packed")
        out = _flashgen_torch.varlen_attention(q[0], k[0], v[0], *packed, **common)
        return out.unsqueeze(0), None

    if q_len <= _DECODE_MAX_QUERIES and kv_len > q_len and not (
            torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)):
        # Generation's steps: a few new queries against the cache. The decode kernels split each sequence's keys
        # across SMs (the dense kernels would give a 128-row tile to each head's few rows); transformers' cache is
        # [batch, heads, seqlen, head_dim], read in place through the transposed views.
        _count("decode")
        out = _flashgen_torch.attention_with_kvcache(q, k, v, softmax_scale=scaling, causal=common["causal"],
                                                     window_size=common["window_size"], softcap=common["softcap"],
                                                     sinks=common["sinks"])
        return out, None

    _count("dense")
    out = _flashgen_torch.attention(q, k, v, causal=common["causal"], scale=scaling, softcap=common["softcap"],
                                    window_size=common["window_size"], sinks=common["sinks"])
    return out, None


def register(name=NAME):
    """Registers flashgen with transformers' AttentionInterface (attention_forward) and AttentionMaskInterface (the
    padding-mask function of transformers' own flash-attention path, which hands the attention function a 2-d
    padding mask or None) under name, and returns it. The name must not contain "flash" (see the module's doc)."""
    if "flash" in name:
        raise FlashgenArgumentError(f"name {name!r} contains 'flash', which transformers takes for a FlashAttention "
                                    "package to import", ERROR_INVALID_ARGUMENT)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
