// flashgen's PyTorch operators on torch's stable ABI (libflashgen_torch.so): the ops' kernels (ops_dense.cpp,
// ops_varlen.cpp, ops_kvcache.cpp) and the helpers they share (ops_common.cpp); ops_library.cpp registers them.
// Each kernel takes torch tensors, checks what the library cannot see (op_arguments.hpp), and calls libflashgen's C
// ABI on the caller's current stream with outputs and workspaces from torch's allocator.
#pragma once

#include "op_arguments.hpp"

#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace flashgen::torch_ops {

using torch::stable::Tensor;

// t itself when the kernels read it in place (16-byte aligned, head_dim unit-stride, the other strides multiples
// of 8 elements), else a fresh contiguous copy.
Tensor readable(const Tensor& t);
// A new contiguous tensor of t's shape and dtype on t's device.
Tensor empty_like_contiguous(const Tensor& t);
// The forward's output: a new contiguous tensor of q's shape, its last dim (head_dim) v's, on q's device, of dtype
// (none: q's).
Tensor empty_output(const Tensor& q, const Tensor& v,
                    std::optional<torch::headeronly::ScalarType> dtype = std::nullopt);

// A backward call's tensors: its inputs each readable in place (or a contiguous copy), held until the call is
// queued, and fresh contiguous gradients shaped like the caller's q, k and v.
struct BackwardTensors {
  Tensor dout, q, k, v, out, lse;
  Tensor dq, dk, dv;
};
BackwardTensors backward_tensors(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse);

// The fp32 extras of a call (ALiBi slopes, sinks), checked, and held until the call is queued: a converted copy
// freed before that could be handed to the next allocation and overwritten before the kernels read it.
struct Extras {
  std::optional<Tensor> alibi_slopes;  // [heads_q] or [batch, heads_q], last dim contiguous
  std::optional<Tensor> sinks;         // [heads_q], contiguous
};
Extras check_extras(const Tensor& q, int64_t batch, int64_t heads_q, const std::optional<Tensor>& alibi_slopes,
                    const std::optional<Tensor>& sinks);

// A call's options; extras' pointers are taken, dsinks is the caller's to set.
flashgen_attention_options options(double scale, const std::string& mask, bool deterministic, double softcap,
                                   int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                   const Extras& extras);

// fp32 [heads_q] for the sinks' gradient with sinks, else empty [0] (an op returns tensors, never None).
Tensor dsinks_for(const Tensor& q, int64_t heads_q, const Extras& extras);

// The caller's current stream on device: the kernels queue there, ordered with torch's own work and captured with
// it into a CUDA graph.
void* current_stream(int32_t device);

// Bytes as a uint8 tensor on t's device, from torch's allocator (a CUDA graph's pool while one is captured).
Tensor workspace_like(const Tensor& t, size_t bytes);

// The ops; their schemas are in ops_library.cpp.
std::tuple<Tensor, Tensor> attention_forward(Tensor q, Tensor k, Tensor v, double scale, std::string mask,
                                             std::string layout, bool deterministic, double softcap,
                                             int64_t window_left, int64_t window_right,
                                             std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks,
                                             int64_t attention_chunk, std::optional<Tensor> q_descale,
                                             std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
                                             std::string out_dtype);

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward(
    Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, double scale, std::string mask,
    std::string layout, bool deterministic, double softcap, int64_t window_left, int64_t window_right,
    std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks, int64_t attention_chunk);

std::tuple<Tensor, Tensor> varlen_attention_forward(
    Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, std::optional<Tensor> seqused_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, std::string mask, bool deterministic,
    std::optional<Tensor> block_table, double softcap, int64_t window_left, int64_t window_right,
    std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks, int64_t attention_chunk,
    std::optional<Tensor> q_descale, std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
    std::string out_dtype);

std::tuple<Tensor, Tensor, Tensor, Tensor> varlen_attention_backward(
    Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, std::string mask, bool deterministic, double softcap,
    int64_t window_left, int64_t window_right, std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks,
    int64_t attention_chunk);

std::tuple<Tensor, Tensor> attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k,
                                             std::optional<Tensor> v, std::optional<Tensor> cache_seqlens,
                                             std::optional<Tensor> block_table, double scale, std::string mask,
                                             int64_t num_splits, int64_t window_left, int64_t window_right,
                                             std::optional<Tensor> sinks, int64_t attention_chunk, double softcap,
                                             std::optional<Tensor> alibi_slopes, std::optional<Tensor> k_scale,
                                             std::optional<Tensor> v_scale);

}  // namespace flashgen::torch_ops
