// The translation of flashgen.h's structs into the library's own types (api/from_c.hpp).
#include "api/from_c.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashgen/error.hpp"

namespace flashgen {

static_assert(static_cast<int>(DType::kFloat16) == FLASHGEN_FLOAT16 &&
                  static_cast<int>(DType::kBFloat16) == FLASHGEN_BFLOAT16 &&
                  static_cast<int>(DType::kFloat8E4M3) == FLASHGEN_FLOAT8_E4M3 &&
                  static_cast<int>(DType::kFloat8E5M2) == FLASHGEN_FLOAT8_E5M2,
              "DType takes flashgen_dtype's values");
static_assert(static_cast<int>(Mask::kNone) == FLASHGEN_MASK_NONE &&
                  static_cast<int>(Mask::kCausal) == FLASHGEN_MASK_CAUSAL &&
                  static_cast<int>(Mask::kCausalTopLeft) == FLASHGEN_MASK_CAUSAL_TOP_LEFT &&
                  static_cast<int>(Mask::kSlidingWindow) == FLASHGEN_MASK_SLIDING_WINDOW,
              "Mask takes flashgen_mask's values");
static_assert(static_cast<int>(UserArgType::kFloat32) == FLASHGEN_ARG_FLOAT32 &&
                  static_cast<int>(UserArgType::kInt32) == FLASHGEN_ARG_INT32 &&
                  static_cast<int>(UserArgType::kInt64) == FLASHGEN_ARG_INT64 &&
                  static_cast<int>(UserArgType::kUint8) == FLASHGEN_ARG_UINT8,
              "UserArgType takes flashgen_arg_type's values");

namespace {

// A function body: not given when NULL.
std::optional<std::string> body_from_c(const char* text) {
  return text != nullptr ? std::optional<std::string>(text) : std::nullopt;
}

// The buffers or scalars (field) of a description: their count and array, and each name given.
std::vector<UserArg> args_from_c(const flashgen_variant_arg* args, int32_t count, const char* field) {
  check_user_arg_count(count, field);
  const std::string what = std::string("desc.") + field;
  FLASHGEN_REQUIRE(count == 0 || args != nullptr, what + " is NULL but num_" + field + " is " + std::to_string(count));
  std::vector<UserArg> out;
  for (int32_t i = 0; i < count; ++i) {
    FLASHGEN_REQUIRE(args[i].name != nullptr, what + "[" + std::to_string(i) + "].name is NULL");
    out.push_back({args[i].name, static_cast<UserArgType>(raw_enum(args[i].type))});
  }
  return out;
}

// A C argument that may be null, as the launchers take it: null stays null (the launcher names it), else translated.
template <class C>
class Nullable {
 public:
  explicit Nullable(const C* argument) {
    if (argument != nullptr) value_ = from_c(*argument);
  }
  const auto* get() const { return value_ ? &*value_ : nullptr; }

 private:
  std::optional<decltype(from_c(std::declval<const C&>()))> value_;
};

}  // namespace

DType from_c(const flashgen_dtype& dtype) { return static_cast<DType>(raw_enum(dtype)); }

Mask from_c(const flashgen_mask& mask) { return static_cast<Mask>(raw_enum(mask)); }

TensorView from_c(const flashgen_tensor& tensor) {
  TensorView view;
  view.data = tensor.data;
  view.dtype = from_c(tensor.dtype);
  for (int i = 0; i < 4; ++i) view.shape[i] = tensor.shape[i], view.stride[i] = tensor.stride[i];
  return view;
}

CallOptions from_c(const flashgen_attention_options& options) {
  CallOptions out;
  out.softmax_scale = options.softmax_scale;
  out.mask = from_c(options.mask);
  out.deterministic = options.deterministic != 0;
  out.softcap = options.softcap;
  out.window_left = options.window_left;
  out.window_right = options.window_right;
  out.alibi_slopes = options.alibi_slopes;
  out.alibi_batch_stride = options.alibi_batch_stride;
  out.sinks = options.sinks;
  out.dsinks = options.dsinks;
  out.attention_chunk = options.attention_chunk;
  if (options.variant != nullptr) out.variant = options.variant->user;
  out.variant_buffers = options.variant_buffers;
  out.variant_scalars = options.variant_scalars;
  out.block_mask = options.block_mask != nullptr ? &options.block_mask->classes : nullptr;
  out.q_descale = options.q_descale, out.k_descale = options.k_descale, out.v_descale = options.v_descale;
  for (int i = 0; i < 2; ++i) {
    out.q_descale_stride[i] = options.q_descale_stride[i];
    out.k_descale_stride[i] = options.k_descale_stride[i];
    out.v_descale_stride[i] = options.v_descale_stride[i];
  }
  return out;
}

VarlenForwardArgs from_c(const flashgen_varlen_forward_args& args) {
  VarlenForwardArgs out;
  out.q = from_c(args.q), out.k = from_c(args.k), out.v = from_c(args.v), out.out = from_c(args.out);
  out.lse = args.lse;
  out.cu_seqlens_q = args.cu_seqlens_q, out.cu_seqlens_k = args.cu_seqlens_k, out.seqused_k = args.seqused_k;
  out.batch = args.batch, out.max_seqlen_q = args.max_seqlen_q, out.max_seqlen_k = args.max_seqlen_k;
  out.options = from_c(args.options);
  out.block_table = args.block_table;
  out.max_pages = args.max_pages;
  return out;
}

VarlenBackwardArgs from_c(const flashgen_varlen_backward_args& args) {
  VarlenBackwardArgs out;
  out.q = from_c(args.q), out.k = from_c(args.k), out.v = from_c(args.v), out.out = from_c(args.out);
  out.dout = from_c(args.dout), out.dq = from_c(args.dq), out.dk = from_c(args.dk), out.dv = from_c(args.dv);
  out.lse = args.lse;
  out.cu_seqlens_q = args.cu_seqlens_q, out.cu_seqlens_k = args.cu_seqlens_k;
  out.batch = args.batch, out.max_seqlen_q = args.max_seqlen_q, out.max_seqlen_k = args.max_seqlen_k;
  out.options = from_c(args.options);
  return out;
}

KvCacheArgs from_c(const flashgen_kvcache_args& args) {
  KvCacheArgs out;
  out.q = from_c(args.q), out.k_cache = from_c(args.k_cache), out.v_cache = from_c(args.v_cache);
  out.k_new = from_c(args.k_new), out.v_new = from_c(args.v_new), out.out = from_c(args.out);
  out.lse = args.lse;
  out.cache_seqlens = args.cache_seqlens;
  out.block_table = args.block_table;
  out.max_pages = args.max_pages;
  out.num_splits = args.num_splits;
  out.workspace = args.workspace;
  out.workspace_bytes = args.workspace_bytes;
  out.options = from_c(args.options);
  out.k_scale = args.k_scale, out.v_scale = args.v_scale;
  for (int i = 0; i < 2; ++i) out.k_scale_stride[i] = args.k_scale_stride[i], out.v_scale_stride[i] = args.v_scale_stride[i];
  return out;
}

UserVariantDesc from_c(const flashgen_variant_desc& desc) {
  const size_t expected = sizeof(flashgen_variant_desc);
  FLASHGEN_REQUIRE(desc.size == expected,
                   "desc.size must be sizeof(flashgen_variant_desc) = " + std::to_string(expected) +
                       " (the flashgen.h this library was built with), got " + std::to_string(desc.size));
  UserVariantDesc out;
  out.mask_mod = body_from_c(desc.mask_mod);
  out.score_mod = body_from_c(desc.score_mod);
  out.score_grad = body_from_c(desc.score_grad);
  out.score_bias = body_from_c(desc.score_bias);
  out.helpers = body_from_c(desc.helpers);
  out.buffers = args_from_c(desc.buffers, desc.num_buffers, "buffers");
  out.scalars = args_from_c(desc.scalars, desc.num_scalars, "scalars");
  out.mask_same_for_heads = desc.mask_same_for_heads != 0;
  return out;
}

ForwardCall make_forward_call(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                              const flashgen_tensor* out, float* lse, const flashgen_attention_options* opts) {
  return make_forward_call(Nullable(q).get(), Nullable(k).get(), Nullable(v).get(), Nullable(out).get(), lse,
                           Nullable(opts).get());
}

BackwardCall make_backward_call(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                                const flashgen_tensor* out, const flashgen_tensor* dout, const float* lse,
                                const flashgen_tensor* dq, const flashgen_tensor* dk, const flashgen_tensor* dv,
                                const flashgen_attention_options* opts) {
  return make_backward_call(Nullable(q).get(), Nullable(k).get(), Nullable(v).get(), Nullable(out).get(),
                            Nullable(dout).get(), lse, Nullable(dq).get(), Nullable(dk).get(), Nullable(dv).get(),
                            Nullable(opts).get());
}

ForwardCall make_varlen_forward_call(const flashgen_varlen_forward_args& args) {
  return make_varlen_forward_call(from_c(args));
}

BackwardCall make_varlen_backward_call(const flashgen_varlen_backward_args& args) {
  return make_varlen_backward_call(from_c(args));
}

KvCacheCall make_kvcache_call(const flashgen_kvcache_args& args) { return make_kvcache_call(from_c(args)); }

}  // namespace flashgen
