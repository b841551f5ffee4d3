// The contract every config type of a generated module keeps (KernelConfig, BwdConfig, DecodeConfig), so that the
// registry loads, the tuner weighs, and the launchers and dispatch ask every family alike: a new family adds a config
// type, its generate(), and its answers of a call.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "generator/generator.hpp"
#include "generator/implementability.hpp"
#include "problem/attention_problem.hpp"

namespace flashgen {

// A kernel module's config C provides:
//   C::Kernel                   the module's kernels, an enum;
//   C::Params                   the run-time parameters its kernels take (templates/attn_params.cuh);
//   name()                      the module's canonical name: its cache key's stem and its file name in dumps;
//   symbol(Kernel)              a kernel's extern "C" symbol in the module;
//   threads(Kernel)             its block size;
//   smem_bytes(Kernel)          its dynamic shared memory (0: none to opt in to);
//   spill_checked_kernels()     the kernels whose spills decide whether the config is worth running;
//   can_implement(problem, params, device)
//                               whether it can run a call on a device, and if not the shortfall and its reason;
//   workspace(params)           the device workspace its kernels need for a call: a Workspace, or a type derived
//                               from it that names its parts;
// and generate(const C&) (generator.hpp) renders the module's source.
template <class C, class = void>
struct IsKernelModule : std::false_type {};

template <class C>
struct IsKernelModule<
    C, std::void_t<typename C::Kernel, typename C::Params, decltype(std::declval<const C&>().name()),
                   decltype(std::declval<const C&>().symbol(std::declval<typename C::Kernel>())),
                   decltype(std::declval<const C&>().threads(std::declval<typename C::Kernel>())),
                   decltype(std::declval<const C&>().smem_bytes(std::declval<typename C::Kernel>())),
                   decltype(generate(std::declval<const C&>()))>>
    : std::bool_constant<
          std::is_same_v<decltype(std::declval<const C&>().spill_checked_kernels()),
                         std::vector<typename C::Kernel>> &&
          std::is_same_v<decltype(std::declval<const C&>().can_implement(
                             std::declval<const AttentionProblem&>(), std::declval<const typename C::Params&>(),
                             std::declval<const DeviceTraits&>())),
                         Implementability> &&
          std::is_base_of_v<Workspace, decltype(std::declval<const C&>().workspace(
                                           std::declval<const typename C::Params&>()))>> {};

static_assert(IsKernelModule<KernelConfig>::value && IsKernelModule<BwdConfig>::value &&
              IsKernelModule<DecodeConfig>::value);

// A config's FP8 cache type: C::cache_dtype where the family reads KV caches (DecodeConfig), else none.
template <class C, class = void>
struct ConfigCacheDtype {
  static std::optional<DType> of(const C&) { return std::nullopt; }
};
template <class C>
struct ConfigCacheDtype<C, std::void_t<decltype(std::declval<const C&>().cache_dtype)>> {
  static std::optional<DType> of(const C& config) { return config.cache_dtype; }
};

// C::out_dtype where a family's config has one (an FP8 forward's output type), else empty.
template <class C, class = void>
struct ConfigOutDtype {
  static std::optional<DType> of(const C&) { return std::nullopt; }
};
template <class C>
struct ConfigOutDtype<C, std::void_t<decltype(std::declval<const C&>().out_dtype)>> {
  static std::optional<DType> of(const C& config) { return config.out_dtype; }
};

// The checks every family's can_implement starts with: the config is for the problem (its dtype, an FP8 cache's
// type, an FP8 forward's output type, head dims, mask, score modifiers and user variant) and can run on sm_<arch>
// (its invalid_reason).
template <class C>
Implementability problem_fit(const C& config, const AttentionProblem& problem, int arch) {
  if (!(config.dtype == problem.dtype && config.head_dim == problem.head_dim() &&
        config.mask == problem.mask_kind() && config.mods == problem.score_mods())) {
    return {Shortfall::kProblem, "does not match the problem (dtype, head_dim, mask, soft cap, ALiBi)"};
  }
  if (const std::optional<DType> cache = ConfigCacheDtype<C>::of(config); cache != problem.cache_dtype) {
    return {Shortfall::kProblem, std::string("reads a cache of ") + dtype_name(cache.value_or(config.dtype)) +
                                     ", the call's holds " + dtype_name(problem.kv_dtype())};
  }
  if (const std::optional<DType> out = ConfigOutDtype<C>::of(config); out != problem.out_dtype) {
    return {Shortfall::kProblem, std::string("writes an output of ") + dtype_name(out.value_or(config.dtype)) +
                                     ", the call's is " + dtype_name(problem.output_dtype())};
  }
  if (config.value_dim() != problem.value_dim()) {
    return {Shortfall::kProblem, "has values of head dim " + std::to_string(config.value_dim()) +
                                     ", the call's have " + std::to_string(problem.value_dim())};
  }
  if (!same_user_variant(config.user, problem.user)) {
    return {Shortfall::kProblem, "does not carry the problem's user variant (" +
                                     (problem.user ? problem.user->tag : std::string("none")) + ")"};
  }
  if (auto why = config.invalid_reason(arch)) return {Shortfall::kArch, *why};
  return {};
}

}  // namespace flashgen
