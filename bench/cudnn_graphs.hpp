// cuDNN's fused-attention graphs for bench/cudnn_variants.cpp: one variant's forward and backward graph, built
// through the cudnn_frontend graph API over the same tensors flashgen reads.
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
// as flashgen's; each is bound by its uid.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv, kSink, kDsink };

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

}  // namespace cudnn_variants
