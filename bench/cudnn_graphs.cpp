// cuDNN's fused-attention graphs (cudnn_graphs.hpp): the tensors' layout, the mask and variant attributes, the soft
// cap's score modifier, and building each pass's graph and the FP8 forward's.
#include "bench/cudnn_graphs.hpp"

#include <cmath>
#include <exception>
#include <functional>

namespace cudnn_variants {

namespace {

fe::graph::Tensor_attributes& lay_out_bshd(fe::graph::Tensor_attributes& t, int64_t uid, const Shape& s) {
  return t.set_uid(uid)
      .set_dim({s.batch, s.heads, s.seqlen, s.head_dim})
      .set_stride({s.seqlen * s.heads * s.head_dim, s.head_dim, s.heads * s.head_dim, 1});
}

std::shared_ptr<fe::graph::Tensor_attributes> bshd(fe::graph::Graph& graph, const char* name, int64_t uid,
                                                   const Shape& s) {
  fe::graph::Tensor_attributes t;
  return graph.tensor(lay_out_bshd(t.set_name(name), uid, s));
}

void set_output_bshd(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, const Shape& s) {
  lay_out_bshd(t->set_output(true), uid, s);
}

std::shared_ptr<fe::graph::Tensor_attributes> stats_tensor(fe::graph::Graph& graph, const Shape& s) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name("stats")
                          .set_uid(kStats)
                          .set_dim({s.batch, s.heads, s.seqlen, 1})
                          .set_stride({s.heads * s.seqlen, s.seqlen, 1, 1})
                          .set_data_type(fe::DataType_t::FLOAT));
}

std::shared_ptr<fe::graph::Tensor_attributes> per_head_tensor(fe::graph::Graph& graph, const char* name, int64_t uid,
                                                              const Shape& s) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, s.heads, 1, 1})
                          .set_stride({s.heads, 1, 1, 1})
                          .set_data_type(fe::DataType_t::FLOAT));
}

// The mask and variant of either pass's attributes (both classes have the same setters). With a score modifier
// (the soft cap) cuDNN applies none of its own masks: the causal mask is part of the modifier (forward_scores).
template <class Attributes>
void apply_variant(Attributes& a, const Variant& v, const Shape& s) {
  a.set_attn_scale(1.f / std::sqrt(float(s.head_dim)));
  if (v.causal && v.softcap == 0) {
    a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  }
  if (v.window >= 0) a.set_diagonal_band_left_bound(v.window + 1);  // exclusive: W + 1 keys, as flashgen's (W, 0)
  if (v.alibi) a.set_alibi_mask(true);
}

// The soft cap's score modifier, with the causal mask after it where the variant has one.
using ScoreModifier = std::function<std::shared_ptr<fe::graph::Tensor_attributes>(
    std::shared_ptr<fe::graph::Graph>, std::shared_ptr<fe::graph::Tensor_attributes>)>;

ScoreModifier forward_scores(const Variant& v, std::shared_ptr<fe::graph::attn::score_modifiers::Softcap> softcap,
                             std::shared_ptr<fe::graph::Tensor_attributes> cap) {
  const bool causal = v.causal;
  return [softcap, cap, causal](std::shared_ptr<fe::graph::Graph> graph,
                                std::shared_ptr<fe::graph::Tensor_attributes> score) {
    auto capped = softcap->forward(graph, score, cap);
    return causal ? fe::graph::attn::score_modifiers::causal_mask(graph, capped) : capped;
  };
}

void finish(CudnnGraph& g, cudnnHandle_t handle) {
  fe::error_t status = g.graph->build(handle, {fe::HeurMode_t::A});
  if (!status.is_good()) {
    g.error = status.get_message();
    return;
  }
  if (!g.graph->get_workspace_size(g.workspace).is_good()) g.error = "no workspace size";
}

// An empty graph of 16-bit tensors with fp32 math, and the soft cap's modifier where the variant has one.
CudnnGraph new_graph(bool bf16, const Variant& v) {
  CudnnGraph g;
  g.graph = std::make_shared<fe::graph::Graph>();
  g.graph->set_io_data_type(bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (v.softcap > 0) g.softcap = std::make_shared<fe::graph::attn::score_modifiers::Softcap>();
  return g;
}

// One fp32 value ([1, 1, 1, 1]) bound by its uid: an FP8 graph's scale, descale or amax.
fe::graph::Tensor_attributes& lay_out_scalar(fe::graph::Tensor_attributes& t, int64_t uid) {
  return t.set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Tensor_attributes> scalar_tensor(fe::graph::Graph& graph, const char* name, int64_t uid) {
  fe::graph::Tensor_attributes t;
  return graph.tensor(lay_out_scalar(t.set_name(name), uid));
}

}  // namespace

CudnnGraph cudnn_forward(cudnnHandle_t handle, const Shape& s, bool bf16, const Variant& v) {
  CudnnGraph g = new_graph(bf16, v);
  fe::graph::Graph& graph = *g.graph;
  auto q = bshd(graph, "q", kQ, s), k = bshd(graph, "k", kK, s), vv = bshd(graph, "v", kV, s);
  auto attributes = fe::graph::SDPA_attributes().set_name("forward").set_generate_stats(true);
  apply_variant(attributes, v, s);
  if (v.softcap > 0) {
    auto cap = graph.tensor(v.softcap, fe::graph::ScalarType::RUNTIME_PARAM);
    attributes.set_score_mod(forward_scores(v, g.softcap, cap));
  }
  if (v.sinks) attributes.set_sink_token(per_head_tensor(graph, "sink", kSink, s));
  auto [o, stats] = graph.sdpa(q, k, vv, attributes);
  set_output_bshd(o, kO, s);
  stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_uid(kStats);
  finish(g, handle);
  return g;
}

CudnnGraph cudnn_backward(cudnnHandle_t handle, const Shape& s, bool bf16, const Variant& v) {
  CudnnGraph g = new_graph(bf16, v);
  fe::graph::Graph& graph = *g.graph;
  auto q = bshd(graph, "q", kQ, s), k = bshd(graph, "k", kK, s), vv = bshd(graph, "v", kV, s);
  auto o = bshd(graph, "o", kO, s), dout = bshd(graph, "do", kDo, s);
  auto stats = stats_tensor(graph, s);
  auto attributes = fe::graph::SDPA_backward_attributes().set_name("backward");
  apply_variant(attributes, v, s);
  if (v.softcap > 0) {
    auto cap = graph.tensor(v.softcap, fe::graph::ScalarType::RUNTIME_PARAM);
    auto softcap = g.softcap;
    attributes.set_score_mod(forward_scores(v, softcap, cap));
    attributes.set_score_mod_bprop([softcap, cap](std::shared_ptr<fe::graph::Graph> gr,
                                                  std::shared_ptr<fe::graph::Tensor_attributes> grad) {
      return softcap->backward(gr, grad, cap);
    });
  }
  if (v.sinks) {
    attributes.set_sink_token(per_head_tensor(graph, "sink", kSink, s));
    attributes.set_dsink_token(per_head_tensor(graph, "dsink", kDsink, s));
  }
  auto [dq, dk, dv] = graph.sdpa_backward(q, k, vv, o, dout, stats, attributes);
  set_output_bshd(dq, kDq, s);
  set_output_bshd(dk, kDk, s);
  set_output_bshd(dv, kDv, s);
  finish(g, handle);
  return g;
}

CudnnGraph cudnn_fp8_forward(cudnnHandle_t handle, const Shape& s, bool causal) {
  CudnnGraph g;
  g.graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& graph = *g.graph;
  graph.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = bshd(graph, "q", kQ, s), k = bshd(graph, "k", kK, s), v = bshd(graph, "v", kV, s);
  auto descale_q = scalar_tensor(graph, "descale_q", kDescaleQ);
  auto descale_k = scalar_tensor(graph, "descale_k", kDescaleK);
  auto descale_v = scalar_tensor(graph, "descale_v", kDescaleV);
  auto descale_s = scalar_tensor(graph, "descale_s", kDescaleS);
  auto scale_s = scalar_tensor(graph, "scale_s", kScaleS);
  auto scale_o = scalar_tensor(graph, "scale_o", kScaleO);
  auto attributes = fe::graph::SDPA_fp8_attributes()
                        .set_name("fp8_forward")
                        .set_generate_stats(true)
                        .set_attn_scale(1.f / std::sqrt(float(s.head_dim)));
  if (causal) attributes.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  try {  // the frontend throws where no SDPA implementation takes the attributes
    auto [o, stats, amax_s, amax_o] =
        graph.sdpa_fp8(q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, attributes);
    set_output_bshd(o, kO, s);
    o->set_data_type(fe::DataType_t::FP8_E4M3);
    stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_uid(kStats);
    lay_out_scalar(amax_s->set_output(true), kAmaxS);
    lay_out_scalar(amax_o->set_output(true), kAmaxO);
  } catch (const std::exception& e) {
    g.error = e.what();
    return g;
  }
  finish(g, handle);
  return g;
}

}  // namespace cudnn_variants
