// The contract every config type of a generated module keeps (KernelConfig, BwdConfig, DecodeConfig), so that the
// registry loads, and the tuner weighs, every family alike: a new family adds a config type and its generate().
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "generator/generator.hpp"

namespace flashgen {

// A kernel module's config C provides:
//   C::Kernel                   the module's kernels, an enum;
//   name()                      the module's canonical name: its cache key's stem and its file name in dumps;
//   symbol(Kernel)              a kernel's extern "C" symbol in the module;
//   threads(Kernel)             its block size;
//   smem_bytes(Kernel)          its dynamic shared memory (0: none to opt in to);
//   spill_checked_kernels()     the kernels whose spills decide whether the config is worth running;
// and generate(const C&) (generator.hpp) renders the module's source.
template <class C, class = void>
struct IsKernelModule : std::false_type {};

template <class C>
struct IsKernelModule<
    C, std::void_t<typename C::Kernel, decltype(std::declval<const C&>().name()),
                   decltype(std::declval<const C&>().symbol(std::declval<typename C::Kernel>())),
                   decltype(std::declval<const C&>().threads(std::declval<typename C::Kernel>())),
                   decltype(std::declval<const C&>().smem_bytes(std::declval<typename C::Kernel>())),
                   decltype(generate(std::declval<const C&>()))>>
    : std::bool_constant<std::is_same_v<decltype(std::declval<const C&>().spill_checked_kernels()),
                                        std::vector<typename C::Kernel>>> {};

static_assert(IsKernelModule<KernelConfig>::value && IsKernelModule<BwdConfig>::value &&
              IsKernelModule<DecodeConfig>::value);

}  // namespace flashgen
