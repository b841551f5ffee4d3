// The flashgen ops' schemas and their CUDA kernels, registered with torch's dispatcher through the stable ABI when
// flashgen.torch loads this library. The schemas are flashgen/torch/_schemas.py's, text for text (the Python
// fallback defines the same ops from there); the fake kernels and autograd are registered from Python.
#include "ops.hpp"

#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(flashgen, m) {
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, float scale, str mask, str layout, bool deterministic, "
        "float softcap=0., int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, Tensor? sinks=None, "
        "int attention_chunk=0, Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, "
        "str out_dtype=\"\") -> (Tensor, Tensor)");
  m.def("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, "
        "str mask, str layout, bool deterministic, float softcap=0., int window_left=-1, int window_right=-1, "
        "Tensor? alibi_slopes=None, Tensor? sinks=None, int attention_chunk=0) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("varlen_attention_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float scale, str mask, bool deterministic, "
        "Tensor? block_table=None, float softcap=0., int window_left=-1, int window_right=-1, "
        "Tensor? alibi_slopes=None, Tensor? sinks=None, int attention_chunk=0, Tensor? q_descale=None, "
        "Tensor? k_descale=None, Tensor? v_descale=None, str out_dtype=\"\") -> (Tensor, Tensor)");
  m.def("varlen_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float scale, str mask, "
        "bool deterministic, float softcap=0., int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, "
        "Tensor? sinks=None, int attention_chunk=0) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("attention_kvcache(Tensor q, Tensor(a1!) k_cache, Tensor(a2!) v_cache, Tensor? k, Tensor? v, "
        "Tensor? cache_seqlens, Tensor? block_table, float scale, str mask, int num_splits, int window_left=-1, "
        "int window_right=-1, Tensor? sinks=None, int attention_chunk=0, float softcap=0., "
        "Tensor? alibi_slopes=None, Tensor? k_scale=None, Tensor? v_scale=None) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(flashgen, CUDA, m) {
  using namespace flashgen::torch_ops;
  m.impl("attention_forward", TORCH_BOX(&attention_forward));
  m.impl("attention_backward", TORCH_BOX(&attention_backward));
  m.impl("varlen_attention_forward", TORCH_BOX(&varlen_attention_forward));
  m.impl("varlen_attention_backward", TORCH_BOX(&varlen_attention_backward));
  m.impl("attention_kvcache", TORCH_BOX(&attention_kvcache));
}
