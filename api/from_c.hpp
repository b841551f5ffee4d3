// flashgen.h's structs as the library's own types: the one translation from the C ABI inward (api/c_api.cpp, and
// tests of what a C call becomes), field for field with no checks but those a C pointer or a struct's size needs;
// and the C ABI's opaque handles, which hold the library's own objects.
#pragma once

#include <cstring>
#include <memory>

#include "flashgen/flashgen.h"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/attention_kvcache.hpp"
#include "launch/user_block_classes.hpp"
#include "problem/call.hpp"
#include "problem/tensor_view.hpp"
#include "problem/user_variant.hpp"

// A user variant's handle: one shared copy of the checked variant.
struct flashgen_variant {
  std::shared_ptr<const flashgen::UserVariant> user;
};

// A block mask's handle: the classes its calls keep.
struct flashgen_block_mask {
  flashgen::KeptBlockClasses classes;
};

namespace flashgen {

// The integer a C caller stored in an enum field. Read through memcpy: loading a value outside the
// enumerators through the enum type is undefined behaviour in C++, and C callers can pass anything.
template <class Enum>
int raw_enum(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized on supported ABIs");
  int raw;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// The caller's values as given (DType and Mask are int-sized: launch/ refuses one outside their enumerators).
DType from_c(const flashgen_dtype& dtype);
Mask from_c(const flashgen_mask& mask);

TensorView from_c(const flashgen_tensor& tensor);
CallOptions from_c(const flashgen_attention_options& options);  // its size is checked by the caller
VarlenForwardArgs from_c(const flashgen_varlen_forward_args& args);
VarlenBackwardArgs from_c(const flashgen_varlen_backward_args& args);
KvCacheArgs from_c(const flashgen_kvcache_args& args);

// A variant's description, its size and the C pointers checked here (desc.size of this flashgen.h, a count of
// buffers or scalars in range and their array given, each name given); make_user_variant checks the rest.
UserVariantDesc from_c(const flashgen_variant_desc& desc);

// The launchers' checked calls of arguments as the C ABI takes them: a null tensor or options pointer stays null,
// for the launcher to name among its other checks in their order.
ForwardCall make_forward_call(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                              const flashgen_tensor* out, float* lse, const flashgen_attention_options* opts);
BackwardCall make_backward_call(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                                const flashgen_tensor* out, const flashgen_tensor* dout, const float* lse,
                                const flashgen_tensor* dq, const flashgen_tensor* dk, const flashgen_tensor* dv,
                                const flashgen_attention_options* opts);
ForwardCall make_varlen_forward_call(const flashgen_varlen_forward_args& args);
BackwardCall make_varlen_backward_call(const flashgen_varlen_backward_args& args);
KvCacheCall make_kvcache_call(const flashgen_kvcache_args& args);

}  // namespace flashgen
