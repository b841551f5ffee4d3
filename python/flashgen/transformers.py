"""flashgen as a Hugging Face transformers attention implementation: register() adds it to transformers'
AttentionInterface and AttentionMaskInterface under the name "fg_attention", then

    import flashgen.transformers
    name = flashgen.transformers.register()                       # "fg_attention"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name, dtype=torch.bfloat16)

The name holds no "flash": transformers (5.x) takes any implementation name containing "flash" for a FlashAttention
package or a Hub kernel to import, and refuses one it cannot import.

Served:
- layer types (config.layer_types): "full_attention"; "sliding_attention" (the layer's sliding_window: Mistral, Gemma,
  gpt-oss); "chunked_attention" (Llama 4: config.attention_chunk_size, chunks counted from each row's first real
  token, as transformers' masks count them). Causal or not, logit soft caps (Gemma 2), attention sinks (gpt-oss's
  s_aux), training (flashgen.torch's autograd).
- caches: none, DynamicCache (full layers, and sliding or chunked layers that keep only a window's keys), StaticCache
  (its rows past the last query are not read).
- batches: dense; padded (a 2-d attention_mask: unpadded into one packed call, padded back); packed sequences (the
  position_ids restarts transformers finds, position_ids that restart at 0, or cu_seq_lens_q/k).
Refused with FlashgenArgumentError naming the cause (never computed otherwise): attention dropout in training,
output_attentions, a 4-d or block mask made outside register()'s mask function, masks with custom or/and mask
functions or bidirectional token blocks (image tokens), a sliding window without a causal mask, padding between a
row's tokens in a chunked layer, and a cache that no longer holds the keys of a query's chunk.

How: the mask function registered here returns the 2-d padding mask as transformers' flash-attention path does, over
every position so far, with MaskFacts attached: where the call's queries and the cache's key rows lie (a sliding cache
drops old keys, a static cache has rows not yet written) and what transformers put in the mask besides causality and
padding. The attention function then reads only the key rows that hold keys (starting at the query's chunk in a
chunked layer, so that flashgen's chunks, counted from key row 0, fall where the model's do) and makes one call:
padded batches and packed sequences a variable-length call; generation's steps without padding (up to 16 new queries
against a longer cache, no gradient) the KV-cache decode kernels on the cache as transformers keeps it; anything else
a dense call. stats() counts the calls of each kind.
"""

import collections
import dataclasses
import threading
from typing import NamedTuple, Optional

import torch

from . import torch as _flashgen_torch
from .torch._kvcache import decode_step as _decode_step
from ._lib import ERROR_INVALID_ARGUMENT, ERROR_UNSUPPORTED, FlashgenArgumentError

NAME = "fg_attention"

# Calls with at most this many queries against a longer cache (generation's steps, speculative tokens) and no
# gradient run the KV-cache decode kernels.
_DECODE_MAX_QUERIES = 16

# The attribute of the mask function's padding mask that holds its MaskFacts.
_FACTS = "_flashgen_mask_facts"
# The attribute of an attention module that keeps (its config, its chunk length): _layer_chunk.
_CHUNK = "_flashgen_chunk"

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


def _refuse(what, code=ERROR_UNSUPPORTED):
    raise FlashgenArgumentError(f"fg_attention: {what}", code)


def _as_int(value):
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


# -------------------------------------------------------------------------------------------------------------
# The mask function: what transformers knows about positions, handed to the attention function.

@dataclasses.dataclass(frozen=True)
class MaskFacts:
    """What register()'s mask function learned while transformers built one kind of mask (full, sliding or chunked)
    for a forward pass, attached to the padding mask it returns."""
    q_offset: int                 # position of the call's first query
    kv_offset: int                # position of the first key row the cache returns
    kv_length: int                # key rows the cache returns (a static cache's include rows not written yet)
    has_padding: bool             # some position of the 2-d mask is padding
    local_size: Optional[int]     # the sliding window or chunk transformers' mask applies; None for full attention
    segments: Optional[tuple]     # (int32 [n + 1] offsets over the rows of the batch flattened, longest): packing
    sees_later_keys: bool         # the pattern lets a query see a later key (bidirectional, or token blocks)


def _pattern_at(mask_function, batch, first, count, step, device):
    """transformers' mask pattern (an index-based mask function) at query position p and key position p + step for
    the count positions p from first: bool [batch, count]."""
    rows = torch.arange(batch, device=device)[:, None]
    head = torch.zeros(1, 1, dtype=torch.long, device=device)
    queries = torch.arange(first, first + count, device=device)[None, :]
    try:
        seen = mask_function(rows, head, queries, queries + step)
    except (IndexError, RuntimeError, TypeError) as error:
        raise FlashgenArgumentError(f"fg_attention: cannot read this mask's pattern by index ({error})",
                                    ERROR_UNSUPPORTED) from error
    return torch.as_tensor(seen, device=device).expand(batch, count)


def _segments(sees_previous):
    """(offsets, longest) of the runs of positions that each see the position before them (sees_previous: bool
    [batch, length - 1] for positions 1...), rows flattened; None when each row is one run."""
    batch = sees_previous.shape[0]
    starts = torch.cat([torch.ones_like(sees_previous[:, :1]), ~sees_previous], dim=1).flatten()
    first = torch.nonzero(starts).flatten()
    if first.numel() == batch:
        return None
    ends = torch.cat([first[1:], first.new_tensor([starts.numel()])])
    return _offsets((ends - first).to(torch.int32))


def padding_mask(batch_size, q_length, kv_length, q_offset=None, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """transformers' mask interface for fg_attention: the 2-d bool padding mask [batch, positions] (all True when
    transformers has none: [batch, q_offset + q_length]) with MaskFacts attached as _flashgen_mask_facts. A 2-d
    tensor, like the flash-attention path's, so that it passes where transformers takes a 2-d mask again (generate
    builds a static cache's masks ahead and hands them back to the model)."""
    if kwargs.get("use_vmap"):
        _refuse("this mask adds custom or_mask_function / and_mask_function rules to transformers' pattern (e.g. "
                "image tokens that see each other); flashgen serves causal, sliding, chunked, padded and packed "
                "attention only")
    if q_offset is None:  # transformers before 5 passes the queries' cache_position instead
        cache_position = kwargs.get("cache_position")
        q_offset = cache_position[0] if cache_position is not None else kv_offset + kv_length - q_length
    q_offset, kv_offset, kv_length = _as_int(q_offset), _as_int(kv_offset), _as_int(kv_length)
    device = kwargs.get("device")
    if attention_mask is None:
        padding = torch.ones(batch_size, q_offset + q_length, dtype=torch.bool, device=device)
        has_padding = False
    else:
        device = attention_mask.device
        # A new tensor object over the same data: each mask kind gets its own facts.
        padding = attention_mask.to(dtype=torch.bool).view(attention_mask.shape)
        has_padding = not bool(padding.all())
    segments, sees_later_keys = None, False
    if not kwargs.get("allow_is_causal_skip", True) and mask_function is not None and q_length > 1:
        # transformers added more than causality and padding (packed sequences, token blocks) or keeps a static
        # cache: the pattern at each query's neighbouring keys says which.
        later = _pattern_at(mask_function, batch_size, q_offset, q_length - 1, 1, device)
        sees_later_keys = bool(later.any())
        if attention_mask is None and q_offset == 0 and kv_offset == 0 and kv_length == q_length:
            # Packed sequences (found only without a cache or padding): a position that does not see the one before
            # it starts a run; in a chunked mask chunk starts are run starts too, so the runs carry the chunks.
            segments = _segments(_pattern_at(mask_function, batch_size, 1, q_length - 1, -1, device))
    local_size = kwargs.get("local_size")
    setattr(padding, _FACTS, MaskFacts(q_offset, kv_offset, kv_length, has_padding,
                                       None if local_size is None else int(local_size), segments, sees_later_keys))
    return padding


# -------------------------------------------------------------------------------------------------------------
# The attention function.

class _Placement(NamedTuple):
    """Where a call's queries and key rows lie in their sequences."""
    q_offset: Optional[int]       # position of the first query; None: unknown (a mask made elsewhere, a cache)
    kv_offset: Optional[int]      # position of key row 0
    rows: int                     # key rows that hold keys: a static cache's rows past the last query hold none yet
    keep: Optional[torch.Tensor]  # bool [batch, rows]: the row is a real token; None: no padding
    first_real: Optional[torch.Tensor]  # int64 [batch]: each row's first real position (chunked layers with padding)


def _layer_chunk(module):
    """The layer's chunk length: config.attention_chunk_size on a layer that config.layer_types marks
    "chunked_attention" (Llama 4's three layers in four), 0 for the others; read once per module (a config's
    attributes are slow to read) and kept in its __dict__."""
    attributes = getattr(module, "__dict__", None)
    if attributes is None:  # a module with __slots__ only
        return _config_chunk(module)
    kept = attributes.get(_CHUNK)
    if kept is None or kept[0] is not getattr(module, "config", None):
        kept = attributes[_CHUNK] = (getattr(module, "config", None), _config_chunk(module))
    return kept[1]


def _config_chunk(module):
    config = getattr(module, "config", None)
    chunk = getattr(config, "attention_chunk_size", None)
    if not chunk:
        return 0
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:  # every layer chunked, as transformers' caches and masks read such a config
        return int(chunk)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_idx is None or not 0 <= layer_idx < len(layer_types):
        _refuse(f"the config has attention_chunk_size {chunk} and layer_types, but {type(module).__name__} has no "
                "layer_idx into them: flashgen cannot tell whether this layer is chunked")
    return int(chunk) if layer_types[layer_idx] == "chunked_attention" else 0


def _check_facts(facts, chunk, sliding_window, causal):
    """The mask transformers built for this layer and the layer's own attributes must describe one pattern."""
    if chunk and facts.local_size != chunk:
        _refuse(f"this layer is chunked (attention_chunk_size {chunk}) but transformers built it a "
                f"{'full' if facts.local_size is None else f'local ({facts.local_size})'} mask")
    if not chunk and facts.local_size is not None and sliding_window != facts.local_size:
        _refuse(f"transformers built this layer a local mask (a window or chunk of {facts.local_size}) but the layer "
                f"passes sliding_window={sliding_window} and is not chunked")
    if causal and facts.sees_later_keys:
        _refuse("this causal layer's mask lets queries see later keys (bidirectional token blocks, e.g. image "
                "tokens): flashgen serves causal, sliding and chunked patterns only")


def _first_real(padding, width):
    """int64 [batch]: each row's first real position in padding[:, :width] (width for a row with none). Refuses
    padding between a row's real tokens: transformers' chunks count from the first real token, by position."""
    real = padding[:, :width]
    count = real.sum(1)
    first = torch.where(count > 0, real.int().argmax(1), torch.full_like(count, width))
    last = width - 1 - real.flip(1).int().argmax(1)
    if bool(((count > 0) & (last - first + 1 != count)).any()):
        _refuse("a chunked layer with padding between a row's tokens (not only before or after them): transformers' "
                "chunks count positions past the left padding, which the packed call cannot reproduce")
    return first


def _placement(attention_mask, batch, q_len, kv_len, causal, chunk, sliding_window, kwargs):
    facts = getattr(attention_mask, _FACTS, None) if isinstance(attention_mask, torch.Tensor) else None
    if facts is not None:
        _check_facts(facts, chunk, sliding_window, causal)
        if kv_len != facts.kv_length:
            _refuse(f"the cache returned {kv_len} key rows where transformers' mask expected {facts.kv_length}")
        # Key row j holds position kv_offset + j; a causal layer's rows past the last query are a static cache's
        # rows not written yet.
        rows = facts.q_offset + q_len - facts.kv_offset if causal else kv_len
        if not q_len <= rows <= kv_len:
            _refuse(f"queries at positions {facts.q_offset}... and {kv_len} key rows from position {facts.kv_offset} "
                    "do not end together")
        keep = first_real = None
        if facts.has_padding:
            width = attention_mask.shape[1]
            end = facts.kv_offset + rows
            # Positions past the 2-d mask are padding, as transformers pads it.
            keep = torch.zeros(batch, rows, dtype=torch.bool, device=attention_mask.device)
            if width > facts.kv_offset:
                keep[:, :min(end, width) - facts.kv_offset] = attention_mask[:, facts.kv_offset:min(end, width)]
            if chunk:
                first_real = _first_real(attention_mask, min(end, width))
        return _Placement(facts.q_offset, facts.kv_offset, rows, keep, first_real)

    # A mask made elsewhere: None, or the 2-d padding mask of the key rows that transformers' flash-attention path
    # gives; the key rows end at the last query.
    if attention_mask is not None and not (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2):
        shape = tuple(getattr(attention_mask, "shape", ()))
        _refuse(f"a {len(shape)}-d attention mask {shape} of type {type(attention_mask).__name__}, made outside "
                "fg_attention's mask function (a custom or pre-built mask): flashgen takes padding as a 2-d mask and "
                "the rest of the pattern from the layer", ERROR_INVALID_ARGUMENT)
    if kv_len == q_len:
        q_offset = 0
    elif kwargs.get("cache_position") is not None:
        q_offset = _as_int(kwargs["cache_position"][0])
    else:
        q_offset = None
    kv_offset = None if q_offset is None else q_offset + q_len - kv_len
    if causal and kv_offset is not None and kv_offset < 0:
        _refuse(f"{kv_len} key rows for queries ending at position {q_offset + q_len}: a static cache's rows not "
                "written yet, which only fg_attention's mask function (register()) tells apart")
    keep = first_real = None
    if attention_mask is not None:
        if attention_mask.shape[1] != kv_len:
            _refuse(f"a 2-d attention mask of {attention_mask.shape[1]} positions for {kv_len} key rows",
                    ERROR_INVALID_ARGUMENT)
        keep = attention_mask.bool()
        if bool(keep.all()):
            keep = None
    if chunk and (q_offset is None or kv_offset < 0 or (keep is not None and kv_offset != 0)):
        _refuse(f"a chunked layer (attention_chunk_size {chunk}) over cached keys whose positions are unknown: "
                "fg_attention's mask function (register()) supplies them")
    if chunk and keep is not None:
        first_real = _first_real(keep, kv_len)
    return _Placement(q_offset, kv_offset, kv_len, keep, first_real)


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


# The last position_ids _packed_offsets read, its version and its answer: every layer of a forward passes the same
# tensor, and reading it waits for the GPU (torch.nonzero), so it is read once per forward.
_LAST_POSITIONS = threading.local()


def _packed_offsets(position_ids):
    """(offsets, longest) of the sequences packed in one row whose position_ids restart at 0 at each sequence, or
    None when position_ids is not such a row (absent, a batch of several rows, or one sequence)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    last = getattr(_LAST_POSITIONS, "read", None)
    if last is not None and last[0] is position_ids and last[1] == position_ids._version:
        return last[2]
    found = _read_packed_offsets(position_ids)
    _LAST_POSITIONS.read = (position_ids, position_ids._version, found)
    return found


def _read_packed_offsets(position_ids):
    positions = position_ids[0]
    starts = torch.nonzero(positions == 0).flatten()
    if starts.numel() <= 1 or starts[0].item() != 0:  # one sequence (or none starting at 0): a dense call
        return None
    ends = torch.cat([starts[1:], starts.new_tensor([positions.numel()])])
    return _offsets((ends - starts).to(torch.int32))


def _lost_keys(position, needed, first_kept, chunk):
    _refuse(f"the query at position {position} needs the keys of its chunk (attention_chunk_size {chunk}) from "
            f"position {needed} on, but the cache returned keys from position {first_kept} only")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, **kwargs):
    """transformers' attention function: query [batch, heads_q, q_len, head_dim], key and value [batch, heads_kv,
    kv_len, head_dim] (the cache's rows included; value's head_dim may be its own, MLA's 128 beside 192),
    attention_mask what register()'s mask function returned (or None, or a 2-d [batch, kv_len] padding mask); returns
    (out [batch, q_len, heads_q, value's head_dim], None)."""
    if dropout and module.training:
        _refuse(f"flashgen has no attention dropout (this call asks for {dropout}): set the model config's "
                "attention_dropout to 0.0, or use another attn_implementation for training with dropout",
                ERROR_INVALID_ARGUMENT)
    if kwargs.get("output_attentions"):
        _refuse("flashgen does not return attention weights (output_attentions=True)", ERROR_INVALID_ARGUMENT)
    batch, heads_q, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    value_dim = value.shape[-1]
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    causal = bool(causal)
    if not causal and sliding_window:
        _refuse(f"a bidirectional sliding window ({sliding_window}): flashgen's windows here are causal ones")
    chunk = _layer_chunk(module)
    place = _placement(attention_mask, batch, q_len, kv_len, causal, chunk, sliding_window, kwargs)
    facts = getattr(attention_mask, _FACTS, None) if isinstance(attention_mask, torch.Tensor) else None

    # Key rows start..rows hold the keys this call reads. Without padding a chunked layer starts at the first query's
    # chunk: flashgen counts chunks from key row 0 (aligned bottom-right), so row 0 must sit on a chunk start.
    start = 0
    if chunk and place.keep is None:
        needed = place.q_offset // chunk * chunk
        if needed < place.kv_offset:
            _lost_keys(place.q_offset, needed, place.kv_offset, chunk)
        start = needed - place.kv_offset
    keys = place.rows - start
    common = dict(softmax_scale=scaling, causal=causal, softcap=softcap or 0.0,
                  window_size=_window(sliding_window, keys), sinks=kwargs.get("s_aux"))
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    # (The decode kernels take values of the keys' head dim, up to 256; other shapes run the dense path's bottom-right
    # mask.)
    if (place.keep is None and q_len <= _DECODE_MAX_QUERIES and keys > q_len and value_dim == head_dim <= 256
            and not (cu_q is not None and cu_k is not None and batch == 1)
            and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))):
        # Generation's steps: a few new queries against the cache. The decode kernels split each sequence's keys
        # across SMs (the dense kernels would give a 128-row tile to each head's few rows); transformers' q and
        # cache are [batch, heads, seqlen, head_dim], read in place as they are.
        _count("decode")
        if start != 0 or place.rows != kv_len:
            key, value = key[:, :, start:place.rows], value[:, :, start:place.rows]
        out = _decode_step(query, key, value, scaling, causal, common["window_size"], common["softcap"],
                           common["sinks"], chunk)
        return out, None

    # [batch, seqlen, heads, head_dim] views of the caller's tensors: the library reads them through their strides.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if start != 0 or place.rows != kv_len:
        k, v = k[:, start:place.rows], v[:, start:place.rows]

    if place.keep is not None:
        _count("padded")
        keep_k = place.keep
        if chunk:
            # Each row reads its keys from the chunk of its first real query on; a chunk's position counts from the
            # row's first real token. Rows before it are never visible, so dropping them changes no result.
            keep_q = keep_k[:, -q_len:]
            has_q = keep_q.any(1)
            first_q = place.q_offset + keep_q.int().argmax(1)
            needed = place.first_real + (first_q - place.first_real) // chunk * chunk
            if bool((has_q & (needed < place.kv_offset)).any()):
                row = int(torch.nonzero(has_q & (needed < place.kv_offset))[0, 0])
                _lost_keys(int(first_q[row]), int(needed[row]), place.kv_offset, chunk)
            positions = torch.arange(place.kv_offset, place.kv_offset + keys, device=keep_k.device)
            keep_k = keep_k & (positions[None, :] >= needed[:, None]) & has_q[:, None]
        # The queries are the last key rows, except in cross-attention (no causal mask, other lengths).
        keep_q = keep_k[:, -q_len:] if causal or keys == q_len else torch.ones_like(keep_k[:, :1]).expand(batch, q_len)
        cu_k, max_k = _offsets(keep_k.sum(1, dtype=torch.int32))
        cu_q, max_q = _offsets(keep_q.sum(1, dtype=torch.int32))
        rows_k = torch.nonzero(keep_k.flatten()).flatten()
        rows_q = torch.nonzero(keep_q.flatten()).flatten()
        k_packed, v_packed = (t.reshape(batch * keys, -1, t.shape[-1]).index_select(0, rows_k) for t in (k, v))
        q_packed = q.reshape(batch * q_len, heads_q, head_dim).index_select(0, rows_q)
        out_packed = _flashgen_torch.varlen_attention(q_packed, k_packed, v_packed, cu_q, cu_k, max_q, max_k,
                                                      attention_chunk=chunk, **common)
        out = out_packed.new_zeros(batch * q_len, heads_q, value_dim).index_copy(0, rows_q, out_packed)
        return out.view(batch, q_len, heads_q, value_dim), None

    if facts is not None and facts.segments is not None and keys == q_len:
        # Packed sequences as transformers found them (no cache): one causal run of positions each. In a chunked
        # layer transformers' chunks split the runs (counted from the row's start), so no chunk is passed on.
        _count("packed")
        offsets, longest = facts.segments
        out = _flashgen_torch.varlen_attention(*(t.reshape(batch * q_len, -1, t.shape[-1]) for t in (q, k, v)),
                                               offsets, offsets, longest, longest, **common)
        return out.view(batch, q_len, heads_q, value_dim), None

    packed = None
    if cu_q is not None and cu_k is not None and batch == 1:
        if start != 0:
            _refuse("cu_seq_lens_q/k in a chunked layer over a cache that dropped keys: the offsets index key rows "
                    "flashgen would have to skip")
        max_q = kwargs.get("max_length_q", kwargs.get("max_seqlen_q"))
        max_k = kwargs.get("max_length_k", kwargs.get("max_seqlen_k"))
        lengths_q, lengths_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
        max_q = int(max_q) if max_q is not None else int(lengths_q.max().item())
        max_k = int(max_k) if max_k is not None else int(lengths_k.max().item())
        packed = (cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k)
    elif batch == 1 and q_len == keys:
        # Sequences whose position_ids restart at 0 (transformers' flash-attention convention): each its own
        # problem, its chunks counted from its own start.
        packed = _packed_offsets(kwargs.get("position_ids"))
        if packed is not None:
            packed = (packed[0], packed[0], packed[1], packed[1])
    if packed is not None:
        _count("packed")
        out = _flashgen_torch.varlen_attention(q[0], k[0], v[0], *packed, attention_chunk=chunk, **common)
        return out.unsqueeze(0), None

    _count("dense")
    out = _flashgen_torch.attention(q, k, v, causal=causal, scale=scaling, softcap=common["softcap"],
                                    window_size=common["window_size"], sinks=common["sinks"], attention_chunk=chunk)
    return out, None


def register(name=NAME):
    """Registers flashgen with transformers' AttentionInterface (attention_forward) and AttentionMaskInterface
    (padding_mask: the 2-d padding mask, as transformers' flash-attention path passes it, with the positions the
    attention function needs) under name, and returns it. The name must not contain "flash" (see the module's doc)."""
    if "flash" in name:
        raise FlashgenArgumentError(f"name {name!r} contains 'flash', which transformers takes for a FlashAttention "
                                    "package to import", ERROR_INVALID_ARGUMENT)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name
