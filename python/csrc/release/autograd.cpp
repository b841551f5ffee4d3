// The autograd of flashgen's dense and packed ops in C++ (libflashgen_torch-<torch version>.so): each forward
// op gets an Autograd kernel that runs its CUDA kernel below autograd and records a C++ node whose backward runs
// the backward op's, so that neither pass of an eager call with gradients enters Python. Where the call would reach
// the CUDA kernel next, both passes call native.cpp's ATen version of it directly; traced calls (fake or functional
// tensors, a dispatch mode) go through the ops. torch's stable ABI has no autograd, so this library is built against
// the C++ API of one torch release and loaded only by that release (flashgen/torch/_native.py); the ops are
// libflashgen_torch.so's. A forward over FP8 q, k and v (dense or packed) has no backward: it records no node, and
// refuses inputs that would want one.
#include "native.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<Tensor>;
namespace native = flashgen::torch_ops::native;

using ForwardSignature = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double,
                                                    c10::string_view, c10::string_view, bool, double, int64_t,
                                                    int64_t, const OptionalTensor&, const OptionalTensor&, int64_t,
                                                    const OptionalTensor&, const OptionalTensor&,
                                                    const OptionalTensor&, c10::string_view);
using BackwardSignature = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, c10::string_view,
    c10::string_view, bool, double, int64_t, int64_t, const OptionalTensor&, const OptionalTensor&, int64_t);
using VarlenForwardSignature = std::tuple<Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&, int64_t, int64_t,
    double, c10::string_view, bool, const OptionalTensor&, double, int64_t, int64_t, const OptionalTensor&,
    const OptionalTensor&, int64_t, const OptionalTensor&, const OptionalTensor&, const OptionalTensor&,
    c10::string_view);
using VarlenBackwardSignature = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, int64_t, int64_t, double, c10::string_view, bool, double, int64_t, int64_t, const OptionalTensor&,
    const OptionalTensor&, int64_t);

// An op's typed handle, looked up once (the op library registered the op before this library loads).
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

Tensor defined_or_none(const OptionalTensor& t) { return t.has_value() ? *t : Tensor(); }
OptionalTensor none_if_undefined(const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

// The options both passes take, kept on the node for the backward.
struct Options {
  double scale, softcap;
  std::string mask;
  bool deterministic;
  int64_t window_left, window_right, attention_chunk;
};

void keep(AutogradContext* ctx, const Options& o) {
  ctx->saved_data["scale"] = o.scale;
  ctx->saved_data["softcap"] = o.softcap;
  ctx->saved_data["mask"] = o.mask;
  ctx->saved_data["deterministic"] = o.deterministic;
  ctx->saved_data["window"] = std::vector<int64_t>{o.window_left, o.window_right, o.attention_chunk};
}

Options kept(AutogradContext* ctx) {
  const auto window = ctx->saved_data["window"].toIntVector();
  return {ctx->saved_data["scale"].toDouble(),         ctx->saved_data["softcap"].toDouble(),
          ctx->saved_data["mask"].toStringRef(),       ctx->saved_data["deterministic"].toBool(),
          window[0], window[1], window[2]};
}

// flashgen::attention_forward's autograd: q, k, v (and sinks) differentiable; lse is returned without a gradient.
struct DenseAttention : torch::autograd::Function<DenseAttention> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                               c10::string_view mask, c10::string_view layout, bool deterministic, double softcap,
                               int64_t window_left, int64_t window_right, const OptionalTensor& alibi_slopes,
                               const OptionalTensor& sinks, int64_t attention_chunk) {
    static const auto forward_op = find_op<ForwardSignature>("flashgen::attention_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const auto keys =
        q.key_set() | k.key_set() | v.key_set() | native::keys_of(alibi_slopes) | native::keys_of(sinks);
    auto [out, lse] = native::reaches_cuda_kernel(forward_op, keys)
                          ? native::attention_forward(q, k, v, scale, mask, layout, softcap, window_left, window_right,
                                                      alibi_slopes, sinks, attention_chunk)
                          : forward_op.call(q, k, v, scale, mask, layout, deterministic, softcap, window_left,
                                            window_right, alibi_slopes, sinks, attention_chunk, std::nullopt,
                                            std::nullopt, std::nullopt, "");
    ctx->save_for_backward({q, k, v, out, lse, defined_or_none(alibi_slopes), defined_or_none(sinks)});
    keep(ctx, {scale, softcap, std::string(mask), deterministic, window_left, window_right, attention_chunk});
    ctx->saved_data["layout"] = std::string(layout);
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(13);
    if (!grads[0].defined()) return result;  // out took no part in the loss
    static const auto backward_op = find_op<BackwardSignature>("flashgen::attention_backward");
    const variable_list saved = ctx->get_saved_variables();
    const Options o = kept(ctx);
    const OptionalTensor sinks = none_if_undefined(saved[6]);
    const OptionalTensor slopes = none_if_undefined(saved[5]);
    const std::string& layout = ctx->saved_data["layout"].toStringRef();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const auto keys = grads[0].key_set() | saved[0].key_set() | saved[1].key_set() | saved[2].key_set() |
                      saved[3].key_set() | saved[4].key_set() | native::keys_of(slopes) | native::keys_of(sinks);
    auto [dq, dk, dv, dsinks] =
        native::reaches_cuda_kernel(backward_op, keys)
            ? native::attention_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], o.scale, o.mask,
                                         layout, o.deterministic, o.softcap, o.window_left, o.window_right, slopes,
                                         sinks, o.attention_chunk)
            : backward_op.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], o.scale, o.mask, layout,
                               o.deterministic, o.softcap, o.window_left, o.window_right, slopes, sinks,
                               o.attention_chunk);
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (sinks.has_value()) result[11] = dsinks;  // none for the slopes, a fixed bias
    return result;
  }
};

// flashgen::varlen_attention_forward's autograd, over packed [total, heads, head_dim] tensors and their offsets.
struct VarlenAttention : torch::autograd::Function<VarlenAttention> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const OptionalTensor& seqused_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, c10::string_view mask,
                               bool deterministic, const OptionalTensor& block_table, double softcap,
                               int64_t window_left, int64_t window_right, const OptionalTensor& alibi_slopes,
                               const OptionalTensor& sinks, int64_t attention_chunk) {
    static const auto forward_op = find_op<VarlenForwardSignature>("flashgen::varlen_attention_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const auto keys = q.key_set() | k.key_set() | v.key_set() | cu_seqlens_q.key_set() | cu_seqlens_k.key_set() |
                      native::keys_of(seqused_k) | native::keys_of(block_table) | native::keys_of(alibi_slopes) |
                      native::keys_of(sinks);
    auto [out, lse] =
        native::reaches_cuda_kernel(forward_op, keys)
            ? native::varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                               max_seqlen_k, scale, mask, block_table, softcap, window_left,
                                               window_right, alibi_slopes, sinks, attention_chunk)
            : forward_op.call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                              deterministic, block_table, softcap, window_left, window_right, alibi_slopes, sinks,
                              attention_chunk, std::nullopt, std::nullopt, std::nullopt, "");
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, defined_or_none(alibi_slopes),
                            defined_or_none(sinks)});
    keep(ctx, {scale, softcap, std::string(mask), deterministic, window_left, window_right, attention_chunk});
    ctx->saved_data["max_seqlens"] = std::vector<int64_t>{max_seqlen_q, max_seqlen_k};
    ctx->saved_data["paged"] = seqused_k.has_value() || block_table.has_value();
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(18);
    if (!grads[0].defined()) return result;
    TORCH_CHECK_NOT_IMPLEMENTED(!ctx->saved_data["paged"].toBool(),
                                "flashgen.torch.varlen_attention: no backward with seqused_k or a block_table");
    static const auto backward_op = find_op<VarlenBackwardSignature>("flashgen::varlen_attention_backward");
    const variable_list saved = ctx->get_saved_variables();
    const Options o = kept(ctx);
    const auto max_seqlens = ctx->saved_data["max_seqlens"].toIntVector();
    const OptionalTensor slopes = none_if_undefined(saved[7]), sinks = none_if_undefined(saved[8]);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::DispatchKeySet keys = grads[0].key_set() | native::keys_of(slopes) | native::keys_of(sinks);
    for (int i = 0; i < 7; ++i) keys = keys | saved[i].key_set();
    auto [dq, dk, dv, dsinks] =
        native::reaches_cuda_kernel(backward_op, keys)
            ? native::varlen_attention_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
                                                saved[6], max_seqlens[0], max_seqlens[1], o.scale, o.mask,
                                                o.deterministic, o.softcap, o.window_left, o.window_right, slopes,
                                                sinks, o.attention_chunk)
            : backward_op.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
                               max_seqlens[0], max_seqlens[1], o.scale, o.mask, o.deterministic, o.softcap,
                               o.window_left, o.window_right, slopes, sinks, o.attention_chunk);
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (sinks.has_value()) result[16] = dsinks;
    return result;
  }
};

std::tuple<Tensor, Tensor> two(const variable_list& outputs) { return {outputs[0], outputs[1]}; }

// Whether a forward is the FP8 forward (or takes arguments only it takes, which the kernel refuses otherwise): forward
// only, no node. Its inputs may not want a gradient: one through it would be wrong, not merely missing
// (flashgen/torch/_checks.py's _FP8_NO_BACKWARD words it the same). op: the op's name for the refusal.
bool fp8_forward(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const OptionalTensor& sinks,
                 const OptionalTensor& q_descale, const OptionalTensor& k_descale, const OptionalTensor& v_descale,
                 c10::string_view out_dtype) {
  using flashgen::torch_ops::is_fp8;
  const bool fp8 = is_fp8(q) || is_fp8(k) || is_fp8(v);
  const bool descaled = q_descale.has_value() || k_descale.has_value() || v_descale.has_value();
  if (!fp8 && !descaled && flashgen::torch_ops::output_dtype(q, out_dtype) == q.scalar_type()) return false;
  const bool wants_grad = q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                          (sinks.has_value() && sinks->requires_grad());
  TORCH_CHECK(!(fp8 && at::GradMode::is_enabled() && wants_grad), op,
              ": the FP8 forward has no backward (FlashAttention-3's neither): pass q, k, v and sinks that do not "
              "require grad (detached), or call under torch.no_grad()");
  return true;
}

std::tuple<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                             c10::string_view mask, c10::string_view layout, bool deterministic,
                                             double softcap, int64_t window_left, int64_t window_right,
                                             const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
                                             int64_t attention_chunk, const OptionalTensor& q_descale,
                                             const OptionalTensor& k_descale, const OptionalTensor& v_descale,
                                             c10::string_view out_dtype) {
  if (fp8_forward("flashgen::attention_forward", q, k, v, sinks, q_descale, k_descale, v_descale, out_dtype)) {
    static const auto forward_op = find_op<ForwardSignature>("flashgen::attention_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op.call(q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right,
                           alibi_slopes, sinks, attention_chunk, q_descale, k_descale, v_descale, out_dtype);
  }
  return two(DenseAttention::apply(q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right,
                                   alibi_slopes, sinks, attention_chunk));
}

std::tuple<Tensor, Tensor> varlen_attention_forward(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
    const OptionalTensor& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, c10::string_view mask,
    bool deterministic, const OptionalTensor& block_table, double softcap, int64_t window_left, int64_t window_right,
    const OptionalTensor& alibi_slopes, const OptionalTensor& sinks, int64_t attention_chunk,
    const OptionalTensor& q_descale, const OptionalTensor& k_descale, const OptionalTensor& v_descale,
    c10::string_view out_dtype) {
  if (fp8_forward("flashgen::varlen_attention_forward", q, k, v, sinks, q_descale, k_descale, v_descale, out_dtype)) {
    static const auto forward_op = find_op<VarlenForwardSignature>("flashgen::varlen_attention_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op.call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                           deterministic, block_table, softcap, window_left, window_right, alibi_slopes, sinks,
                           attention_chunk, q_descale, k_descale, v_descale, out_dtype);
  }
  return two(VarlenAttention::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale,
                                    mask, deterministic, block_table, softcap, window_left, window_right, alibi_slopes,
                                    sinks, attention_chunk));
}

}  // namespace

TORCH_LIBRARY_IMPL(flashgen, Autograd, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("varlen_attention_forward", &varlen_attention_forward);
}
