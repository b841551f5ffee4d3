// The dense and packed ops' CUDA kernels over ATen tensors (libflashgen_torch-<release>.so): what the op library's
// kernels do, without the stable ABI's boxed calls. autograd.cpp takes them where a call would reach the op's CUDA
// kernel anyway (plain CUDA tensors, no tracing or dispatch mode in effect); sdpa.cpp shares the tensor helpers.
#pragma once

#include "../op_arguments.hpp"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

namespace flashgen::torch_ops::native {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

// Whether a call of op whose tensor arguments carry these dispatch keys would run op's CUDA kernel next: the
// tensors are plain CUDA tensors and no mode (tracing, functionalization, a Python dispatch mode) is in effect.
bool reaches_cuda_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet tensor_keys);

inline c10::DispatchKeySet keys_of(const OptionalTensor& t) {
  return t.has_value() ? t->key_set() : c10::DispatchKeySet();
}

// t itself when the kernels read it in place, else a fresh contiguous copy (a fresh allocation: t may be contiguous
// and misaligned).
inline Tensor readable(const Tensor& t) {
  return readable_in_place(t) ? t : at::empty(t.sizes(), t.options()).copy_(t);
}

// The caller's current CUDA stream on device.
void* current_stream(c10::DeviceIndex device);

std::tuple<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                             std::string_view mask, std::string_view layout, double softcap,
                                             int64_t window_left, int64_t window_right,
                                             const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
                                             int64_t attention_chunk);

// dq, dk, dv and the sinks' gradient (undefined without sinks).
std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    double scale, std::string_view mask, std::string_view layout, bool deterministic, double softcap,
    int64_t window_left, int64_t window_right, const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
    int64_t attention_chunk);

std::tuple<Tensor, Tensor> varlen_attention_forward(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
    const OptionalTensor& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, std::string_view mask,
    const OptionalTensor& block_table, double softcap, int64_t window_left, int64_t window_right,
    const OptionalTensor& alibi_slopes, const OptionalTensor& sinks, int64_t attention_chunk);

std::tuple<Tensor, Tensor, Tensor, Tensor> varlen_attention_backward(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double scale,
    std::string_view mask, bool deterministic, double softcap, int64_t window_left, int64_t window_right,
    const OptionalTensor& alibi_slopes, const OptionalTensor& sinks, int64_t attention_chunk);

}  // namespace flashgen::torch_ops::native
