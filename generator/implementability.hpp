// What a kernel module's config answers of one call (generator/kernel_module.hpp): whether it can implement the call
// on a device, with the reason when not, and the device workspace its kernels need. No GPU: plain sizes and layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "templates/attn_params.cuh"

namespace flashgen {

// The device a call runs on, as a config's can_implement reads it (runtime/cuda_driver.hpp's device_traits fills it).
struct DeviceTraits {
  int sm = 0;               // as device_sm
  int multiprocessors = 0;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  int l2_bytes = 0;         // CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
};

// Why a config cannot run a call; dispatch's planner picks a fallback for the last two.
enum class Shortfall {
  kNone,
  kProblem,    // the config is for another problem (dtype, head_dim, mask, modifiers, variant, batch or cache kind)
  kArch,       // the config cannot run on the device's sm (its invalid_reason)
  kGridLimit,  // the config's grid for the call passes the device's limits
  kTmaLayout,  // the sm90 family: TMA cannot describe one of the tensors (dispatch: the sm80 family)
  kTileCount,  // a persistent kernel: more tiles than its int indices reach (dispatch: not persistent)
};

struct Implementability {
  Shortfall shortfall = Shortfall::kNone;
  std::string reason;  // e.g. "q: the base address is not 16-byte aligned"; empty when it can
  explicit operator bool() const { return shortfall == Shortfall::kNone; }
};

// The error a launcher raises for a config (by name) that cannot implement its call: kUnsupported where TMA cannot
// describe a tensor, else kInvalidArgument, the message naming the config and the reason.
[[noreturn]] void fail_unimplementable(const std::string& config, const Implementability& answer);

// The parts of a launch's workspace start a multiple of 256 bytes apart (as cuMemAlloc and the pools align memory),
// which the kernels' vector accesses rely on: a part's bytes rounded up to that.
inline constexpr size_t kWorkspacePartAlignment = 256;
inline constexpr size_t align_workspace_part(size_t bytes) {
  return (bytes + kWorkspacePartAlignment - 1) / kWorkspacePartAlignment * kWorkspacePartAlignment;
}

// A module's device workspace for one call: the bytes of one allocation whose parts are placed one after another,
// each at an aligned offset. A family's own workspace type derives from it and names its parts' offsets.
struct Workspace {
  static constexpr size_t kAbsent = SIZE_MAX;  // the offset of a part the call does not need
  size_t bytes = 0;

  // Places a part of part_bytes at the end and returns its offset.
  size_t append(size_t part_bytes) {
    const size_t offset = bytes;
    bytes += align_workspace_part(part_bytes);
    return offset;
  }
};

// A part's address in a workspace at base, or 0 where the part is absent.
inline uint64_t workspace_part(uint64_t base, size_t offset) {
  return offset == Workspace::kAbsent ? 0 : base + offset;
}

}  // namespace flashgen
