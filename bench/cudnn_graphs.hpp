// cuDNN's fused-attention graphs for bench/cudnn_variants.cpp and bench/cudnn_fp8.cpp: one variant's forward and
// backward graph, and the FP8 forward's, built through the cudnn_frontend graph API over the tensors flashgen reads.
#pragma once

#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <string>

namespace cudnn_variants {

namespace fe = cudnn_frontend;

// One variant, on top of the causal mask unless `causal` is false.
struct Variant {
  std::string name;
  bool causal = true;
  int window = -1;      // keys before the diagonal; -1: unbounded
  float softcap = 0.f;  // 0: none
  bool alibi = false;
  bool sinks = false;
};

// One problem's sizes: every tensor [batch, seqlen, heads, head_dim] in memory.
struct Shape {
  int64_t batch, seqlen, heads, head_dim;
  int64_t elements() const { return batch * seqlen * heads * head_dim; }
  int64_t rows() const { return batch * heads * seqlen; }
};

// The graphs' tensors are [batch, heads, seqlen, head_dim] logically, [batch, seqlen, heads, head_dim] in memory,
// as flashgen's; each is bound by its uid. kDescaleQ to kAmaxO: the FP8 forward's fp32 scalars, one value each.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv, kSink, kDsink,
  kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO
};

struct CudnnGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::shared_ptr<fe::graph::attn::score_modifiers::Softcap> softcap;  // kept alive for the bprop's closure
  int64_t workspace = 0;
  std::string error;  // not empty: cuDNN does not support this graph here
};

// The forward graph of a variant (O and the softmax stats), built for the handle's device; error set where cuDNN
// does not support it.
CudnnGraph cudnn_forward(cudnnHandle_t handle, const Shape& s, bool bf16, const Variant& v);

// The backward graph of a variant (dQ, dK, dV; the sinks' gradient with sinks), likewise.
CudnnGraph cudnn_backward(cudnnHandle_t handle, const Shape& s, bool bf16, const Variant& v);

// The FP8 forward graph (cuDNN's sdpa_fp8): q, k and v e4m3, each with a per-tensor descale; P rounded to e4m3 as
// P · scale_s and read back with descale_s; O written in e4m3 as O · scale_o (a 16-bit O is Blackwell-only in
// cuDNN), with the softmax stats in fp32 and the amax of P and of O. Causal: the top-left diagonal, the only
// alignment cuDNN's FP8 forward takes on Hopper. error set where cuDNN does not support it.
CudnnGraph cudnn_fp8_forward(cudnnHandle_t handle, const Shape& s, bool causal);

}  // namespace cudnn_variants
