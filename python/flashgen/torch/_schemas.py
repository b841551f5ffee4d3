"""The schemas of flashgen's custom ops, one text for both ways they are defined: by libflashgen_torch.so in C++
(python/csrc/ops_library.cpp writes the same text) or, without it, by _ops.py in Python. scale 0.0 means
1/sqrt(head_dim); mask is "none", "bottom_right", "top_left" or "window"; layout is "bshd" or "bhsd"; softcap 0.0 means
no soft cap; window_left and window_right are the window's sides (mask "window" only; -1 for no bound); alibi_slopes
None or the ALiBi slopes; sinks None or the attention sinks (fp32 [heads_q]); attention_chunk 0 or the chunk's length
(any mask but "top_left"); k_scale and v_scale None or an FP8 cache's scales (fp32 [], [1], [heads_kv] or [batch,
heads_kv]); q_descale, k_descale and v_descale None or the FP8 forward's descales (FlashAttention-3's: fp32 [batch,
heads_kv] or any shape that broadcasts to it, read through its strides), out_dtype "" or its output's dtype by
name ("bfloat16" or "float16"; "": bfloat16 for FP8 q, k and v, q's dtype otherwise). Each newer argument was added
last with a default, so that older calls still bind.
Outputs are new contiguous tensors in the inputs' layout; lse is fp32 [batch, heads_q, seqlen_q] in either layout
([heads_q, total_q] packed); the backward ops' fourth output is dsinks, fp32 [heads_q] with sinks, else empty [0].
"""

SCHEMAS = {
    "attention_forward": (
        "(Tensor q, Tensor k, Tensor v, float scale, str mask, str layout, bool deterministic, float softcap=0., "
        "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, Tensor? sinks=None, "
        "int attention_chunk=0, Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, "
        "str out_dtype=\"\") -> (Tensor, Tensor)"),
    "attention_backward": (
        "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, str mask, str layout, "
        "bool deterministic, float softcap=0., int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, "
        "Tensor? sinks=None, int attention_chunk=0) -> (Tensor, Tensor, Tensor, Tensor)"),
    "varlen_attention_forward": (
        "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, "
        "int max_seqlen_q, int max_seqlen_k, float scale, str mask, bool deterministic, Tensor? block_table=None, "
        "float softcap=0., int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, Tensor? sinks=None, "
        "int attention_chunk=0, Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, "
        "str out_dtype=\"\") -> (Tensor, Tensor)"),
    "varlen_attention_backward": (
        "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float scale, str mask, bool deterministic, "
        "float softcap=0., int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, Tensor? sinks=None, "
        "int attention_chunk=0) -> (Tensor, Tensor, Tensor, Tensor)"),
    "attention_kvcache": (
        "(Tensor q, Tensor(a1!) k_cache, Tensor(a2!) v_cache, Tensor? k, Tensor? v, Tensor? cache_seqlens, "
        "Tensor? block_table, float scale, str mask, int num_splits, int window_left=-1, int window_right=-1, "
        "Tensor? sinks=None, int attention_chunk=0, float softcap=0., Tensor? alibi_slopes=None, "
        "Tensor? k_scale=None, Tensor? v_scale=None) -> (Tensor, Tensor)"),
}

# The arguments each op writes in place.
MUTATES = {"attention_kvcache": ("k_cache", "v_cache"), "variant_attention_kvcache": ("k_cache", "v_cache")}

# The ops of calls with a user variant (mask_mod, score_mod, score_bias), defined by _ops.py in Python in both
# backends: variant is _variants.variant_op_arguments' description (a text of the bodies and the arguments' names and
# types), variant_tensors and variant_numbers its arguments in that order. The rest as attention_forward and
# attention_backward, as varlen_attention_forward and varlen_attention_backward, and as attention_kvcache.
VARIANT_SCHEMAS = {
    "variant_attention_forward": (
        "(Tensor q, Tensor k, Tensor v, float scale, str mask, str layout, bool deterministic, float softcap, "
        "int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks, int attention_chunk, str variant, "
        "Tensor[] variant_tensors, float[] variant_numbers) -> (Tensor, Tensor)"),
    "variant_attention_backward": (
        "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, str mask, str layout, "
        "bool deterministic, float softcap, int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks, "
        "int attention_chunk, str variant, Tensor[] variant_tensors, float[] variant_numbers) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "variant_varlen_attention_forward": (
        "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, "
        "int max_seqlen_q, int max_seqlen_k, float scale, str mask, bool deterministic, Tensor? block_table, "
        "float softcap, int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks, int attention_chunk, "
        "str variant, Tensor[] variant_tensors, float[] variant_numbers) -> (Tensor, Tensor)"),
    "variant_varlen_attention_backward": (
        "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float scale, str mask, bool deterministic, "
        "float softcap, int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks, int attention_chunk, "
        "str variant, Tensor[] variant_tensors, float[] variant_numbers) -> (Tensor, Tensor, Tensor, Tensor)"),
    "variant_attention_kvcache": (
        "(Tensor q, Tensor(a1!) k_cache, Tensor(a2!) v_cache, Tensor? k, Tensor? v, Tensor? cache_seqlens, "
        "Tensor? block_table, float scale, str mask, int num_splits, int window_left, int window_right, "
        "Tensor? sinks, int attention_chunk, float softcap, Tensor? alibi_slopes, str variant, "
        "Tensor[] variant_tensors, float[] variant_numbers, Tensor? k_scale=None, Tensor? v_scale=None) "
        "-> (Tensor, Tensor)"),
}
