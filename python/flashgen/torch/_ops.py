"""flashgen's custom ops (torch.ops.flashgen.*), with fake implementations and autograd, so that torch.compile keeps
them in its graphs and torch.export records them. The ops are defined by libflashgen_torch.so where it loads
(_native.py: C++ kernels on torch's stable ABI), else here in Python over the C ABI (_calls.py), from one set of
schemas (_schemas.py); the fakes and the autograd formulas are registered here in both cases. The Python kernels
pass the window as a (left, right) pair.
"""

import torch

from . import _native
from ._autograd import (_backward, _setup_context, _variant_backward, _variant_setup_context,
                        _variant_varlen_backward, _variant_varlen_setup_context, _varlen_backward_formula,
                        _varlen_setup_context)
from ._calls import _backward_kernels, _dsinks, _forward, _varlen_backward, _varlen_forward
from ._checks import (_check_fp8_forward, _check_inputs, _check_varlen_fp8, _lse_shape, _out_dtype_of_name,
                      _out_shape)
from ._kvcache_calls import _kvcache
from ._schemas import MUTATES, SCHEMAS, VARIANT_SCHEMAS
from ._variants import from_op_arguments


# The Python kernels, for a process without the op library.

def _attention_forward(q, k, v, scale, mask, layout, deterministic, softcap=0.0, window_left=-1, window_right=-1,
                       alibi_slopes=None, sinks=None, attention_chunk=0, q_descale=None, k_descale=None,
                       v_descale=None, out_dtype=""):
    return _forward(q, k, v, scale, mask, layout, softcap=softcap, window=(window_left, window_right),
                    alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=attention_chunk,
                    descales=(q_descale, k_descale, v_descale), out_dtype=_out_dtype_of_name(out_dtype))


def _attention_backward(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap=0.0, window_left=-1,
                        window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0):
    return _backward_kernels(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap,
                             (window_left, window_right), alibi_slopes, sinks, attention_chunk)


def _varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                              deterministic, block_table=None, softcap=0.0, window_left=-1, window_right=-1,
                              alibi_slopes=None, sinks=None, attention_chunk=0, q_descale=None, k_descale=None,
                              v_descale=None, out_dtype=""):
    descales, out_dtype = _check_varlen_fp8(q, k, cu_seqlens_q, (q_descale, k_descale, v_descale),
                                            _out_dtype_of_name(out_dtype))
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                           block_table, softcap, (window_left, window_right), alibi_slopes, sinks, attention_chunk,
                           descales=descales, out_dtype=out_dtype)


def _varlen_attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                               mask, deterministic, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None,
                               sinks=None, attention_chunk=0):
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            mask, deterministic, softcap, (window_left, window_right), alibi_slopes, sinks,
                            attention_chunk)


def _attention_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window_left=-1,
                       window_right=-1, sinks=None, attention_chunk=0, softcap=0.0, alibi_slopes=None, k_scale=None,
                       v_scale=None):
    return _kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                    (window_left, window_right), sinks, attention_chunk, softcap, alibi_slopes, k_scale=k_scale,
                    v_scale=v_scale)


# The variant ops' kernels: the description compiled (once per process) and bound to the call's tensors and numbers.

def _variant_attention_forward(q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right,
                               alibi_slopes, sinks, attention_chunk, variant, variant_tensors, variant_numbers):
    return _forward(q, k, v, scale, mask, layout, softcap=softcap, window=(window_left, window_right),
                    alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=attention_chunk,
                    user=from_op_arguments(variant, variant_tensors, variant_numbers))


def _variant_attention_backward(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap, window_left,
                                window_right, alibi_slopes, sinks, attention_chunk, variant, variant_tensors,
                                variant_numbers):
    return _backward_kernels(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap,
                             (window_left, window_right), alibi_slopes, sinks, attention_chunk,
                             user=from_op_arguments(variant, variant_tensors, variant_numbers))


def _variant_varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                      scale, mask, deterministic, block_table, softcap, window_left, window_right,
                                      alibi_slopes, sinks, attention_chunk, variant, variant_tensors, variant_numbers):
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                           block_table, softcap, (window_left, window_right), alibi_slopes, sinks, attention_chunk,
                           user=from_op_arguments(variant, variant_tensors, variant_numbers))


def _variant_varlen_attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, scale, mask, deterministic, softcap, window_left, window_right,
                                       alibi_slopes, sinks, attention_chunk, variant, variant_tensors,
                                       variant_numbers):
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            mask, deterministic, softcap, (window_left, window_right), alibi_slopes, sinks,
                            attention_chunk, user=from_op_arguments(variant, variant_tensors, variant_numbers))


def _variant_attention_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                               window_left, window_right, sinks, attention_chunk, softcap, alibi_slopes, variant,
                               variant_tensors, variant_numbers, k_scale=None, v_scale=None):
    return _kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                    (window_left, window_right), sinks, attention_chunk, softcap, alibi_slopes,
                    user=from_op_arguments(variant, variant_tensors, variant_numbers), k_scale=k_scale,
                    v_scale=v_scale)


_VARIANT_KERNELS = {"variant_attention_forward": _variant_attention_forward,
                    "variant_attention_backward": _variant_attention_backward,
                    "variant_varlen_attention_forward": _variant_varlen_attention_forward,
                    "variant_varlen_attention_backward": _variant_varlen_attention_backward,
                    "variant_attention_kvcache": _variant_attention_kvcache}


_PYTHON_KERNELS = {"attention_forward": _attention_forward, "attention_backward": _attention_backward,
                   "varlen_attention_forward": _varlen_attention_forward,
                   "varlen_attention_backward": _varlen_attention_backward, "attention_kvcache": _attention_kvcache}


# The fake kernels: output shapes and dtypes, and the checks that name the caller's arguments while tracing.

def _attention_forward_fake(q, k, v, scale, mask, layout, deterministic, softcap=0.0, window_left=-1,
                            window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0, q_descale=None,
                            k_descale=None, v_descale=None, out_dtype=""):
    # FP8 q, k and v give out of out_dtype (bfloat16 when ""), 16-bit ones of their own dtype.
    _check_inputs(q, k, v, layout, True)
    _, out_dtype = _check_fp8_forward(q, k, layout, (q_descale, k_descale, v_descale), _out_dtype_of_name(out_dtype))
    return q.new_empty(_out_shape(q, v), dtype=out_dtype), q.new_empty(_lse_shape(q, layout), dtype=torch.float32)


def _attention_backward_fake(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap=0.0,
                             window_left=-1, window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0):
    _check_inputs(q, k, v, layout)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _dsinks(q, _lse_shape(q, layout)[1], sinks))


def _varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale,
                                   mask, deterministic, block_table=None, softcap=0.0, window_left=-1,
                                   window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0, q_descale=None,
                                   k_descale=None, v_descale=None, out_dtype=""):
    # FP8 q, k and v give out of out_dtype (bfloat16 when ""), 16-bit ones of their own dtype.
    _, out_dtype = _check_varlen_fp8(q, k, cu_seqlens_q, (q_descale, k_descale, v_descale),
                                     _out_dtype_of_name(out_dtype))
    return (q.new_empty(_out_shape(q, v), dtype=out_dtype),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


def _varlen_attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    scale, mask, deterministic, softcap=0.0, window_left=-1, window_right=-1,
                                    alibi_slopes=None, sinks=None, attention_chunk=0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _dsinks(q, q.shape[1], sinks)


def _attention_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                            window_left=-1, window_right=-1, sinks=None, attention_chunk=0, softcap=0.0,
                            alibi_slopes=None, k_scale=None, v_scale=None):
    return q.new_empty(_out_shape(q, v_cache)), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _variant_attention_forward_fake(q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right,
                                    alibi_slopes, sinks, attention_chunk, variant, variant_tensors, variant_numbers):
    return _attention_forward_fake(q, k, v, scale, mask, layout, deterministic)


def _variant_attention_backward_fake(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap,
                                     window_left, window_right, alibi_slopes, sinks, attention_chunk, variant,
                                     variant_tensors, variant_numbers):
    return _attention_backward_fake(dout, q, k, v, out, lse, scale, mask, layout, deterministic, sinks=sinks)


def _variant_varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                           max_seqlen_k, scale, mask, deterministic, block_table, softcap,
                                           window_left, window_right, alibi_slopes, sinks, attention_chunk, variant,
                                           variant_tensors, variant_numbers):
    return _varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                          scale, mask, deterministic)


def _variant_varlen_attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, scale, mask, deterministic, softcap, window_left,
                                            window_right, alibi_slopes, sinks, attention_chunk, variant,
                                            variant_tensors, variant_numbers):
    return _varlen_attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, scale, mask, deterministic, sinks=sinks)


def _variant_attention_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                                    window_left, window_right, sinks, attention_chunk, softcap, alibi_slopes, variant,
                                    variant_tensors, variant_numbers, k_scale=None, v_scale=None):
    return _attention_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits)


_FAKE_KERNELS = {"attention_forward": _attention_forward_fake, "attention_backward": _attention_backward_fake,
                 "varlen_attention_forward": _varlen_attention_forward_fake,
                 "varlen_attention_backward": _varlen_attention_backward_fake,
                 "attention_kvcache": _attention_kvcache_fake,
                 "variant_attention_forward": _variant_attention_forward_fake,
                 "variant_attention_backward": _variant_attention_backward_fake,
                 "variant_varlen_attention_forward": _variant_varlen_attention_forward_fake,
                 "variant_varlen_attention_backward": _variant_varlen_attention_backward_fake,
                 "variant_attention_kvcache": _variant_attention_kvcache_fake}


def _define():
    """Defines the ops (unless the op library did) and registers their fakes and autograd (unless the autograd
    library did)."""
    native = _native.load() is not None
    for name, schema in SCHEMAS.items():
        qualified = f"flashgen::{name}"
        if not native:
            torch.library.custom_op(qualified, _PYTHON_KERNELS[name], mutates_args=MUTATES.get(name, ()),
                                    schema=schema)
        torch.library.register_fake(qualified, _FAKE_KERNELS[name])
    for name, schema in VARIANT_SCHEMAS.items():  # Python in both backends: the description is compiled from here
        qualified = f"flashgen::{name}"
        torch.library.custom_op(qualified, _VARIANT_KERNELS[name], mutates_args=MUTATES.get(name, ()), schema=schema)
        torch.library.register_fake(qualified, _FAKE_KERNELS[name])
    torch.library.register_autograd("flashgen::variant_attention_forward", _variant_backward,
                                    setup_context=_variant_setup_context)
    torch.library.register_autograd("flashgen::variant_varlen_attention_forward", _variant_varlen_backward,
                                    setup_context=_variant_varlen_setup_context)
    if _native.release_loaded():  # the release library registered the same formulas in C++
        return
    torch.library.register_autograd("flashgen::attention_forward", _backward, setup_context=_setup_context)
    torch.library.register_autograd("flashgen::varlen_attention_forward", _varlen_backward_formula,
                                    setup_context=_varlen_setup_context)


_define()
