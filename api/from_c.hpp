// flashgen.h's structs as the library's own types: the one translation from the C ABI inward (api/c_api.cpp uses
// it; tests that exercise the C ABI's structs may too), and the definitions of the C ABI's opaque handles.
#pragma once

#include "flashgen/flashgen.h"
#include "problem/user_variant.hpp"

namespace flashgen {

// A variant's description, its size and the C pointers checked here (desc.size of this flashgen.h, a count of
// buffers or scalars in range and their array given, each name given); make_user_variant checks the rest.
UserVariantDesc from_c(const flashgen_variant_desc& desc);

}  // namespace flashgen
