// Prints "<config-name> <arch>" for every config of the built-in lists: heuristic_forward_configs and
// heuristic_backward_configs (every entry, not only the first) for fp16/bf16 x each head_dim the families
// accept x mask none/causal x (backward) both strategies, on sm_80 and sm_90, and default_forward_candidates.
// Built and run by scripts/compare_kernels.py against a flashgen build:
//   c++ -std=c++17 -I<src> -I<src>/include scripts/list_kernel_configs.cpp -L<build> -lflashgen
#include <cstdio>
#include <set>
#include <string>
#include <utility>

#include "flashgen/error.hpp"
#include "tuner/heuristic.hpp"

int main() {
  using namespace flashgen;
  std::set<std::pair<std::string, int>> seen;
  auto print = [&](const std::string& name, int arch) {
    if (seen.insert({name, arch}).second) std::printf("%s %d\n", name.c_str(), arch);
  };
  for (int arch : {80, 90}) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
        for (int d = 8; d <= 256; d += 8) {
          try {
            for (const KernelConfig& c : heuristic_forward_configs(dtype, d, mask, arch)) print(c.name(), arch);
          } catch (const Error&) {  // no config for this head_dim on this arch
          }
          for (bool deterministic : {false, true}) {
            try {
              for (const BwdConfig& c : heuristic_backward_configs(dtype, d, mask, deterministic, arch))
                print(c.name(), arch);
            } catch (const Error&) {
            }
          }
        }
    for (const KernelConfig& c : default_forward_candidates(arch)) print(c.name(), arch);
  }
  return 0;
}
