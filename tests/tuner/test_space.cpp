// Tests for tuner/space: the forward search space's size, its split into valid and pruned configs by the
// shared validity function (counted per reason), its fixed order, and how the arch's shared memory shrinks it.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "generator/kernel_config.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/space.hpp"

using flashgen::DType;
using flashgen::KernelConfig;
using flashgen::MaskKind;

namespace {

// The product of the knobs in the documented nesting order, independent of forward_space: the oracle.
// The sm90 family's product follows on sm_90.
std::vector<KernelConfig> product(DType dtype, int head_dim, MaskKind mask, const flashgen::ForwardKnobs& knobs,
                                  int arch) {
  std::vector<KernelConfig> out;
  for (int m : knobs.block_m)
    for (int n : knobs.block_n)
      for (int w : knobs.warps)
        for (int s : knobs.stages)
          for (bool q : knobs.q_in_regs)
            out.push_back(KernelConfig{dtype, head_dim, mask, m, n, s, flashgen::Sm80Knobs{w, q}});
  if (arch != 90) return out;
  for (int m : knobs.sm90_block_m)
    for (int n : knobs.sm90_block_n)
      for (int s : knobs.sm90_stages)
        for (bool overlap : knobs.sm90_overlap)
          for (bool pingpong : knobs.sm90_pingpong)
            for (bool persistent : knobs.sm90_persistent)
              for (bool p_smem : knobs.sm90_p_smem)
                for (int cluster : knobs.sm90_cluster)
                  for (int groups : knobs.sm90_groups)
                    for (bool tensor_sum : knobs.sm90_tensor_sum) {
                      flashgen::Sm90Knobs k;
                      k.overlap = overlap;
                      k.pingpong = pingpong;
                      k.persistent = persistent;
                      k.p_smem = p_smem;
                      k.cluster = cluster;
                      k.groups = groups;
                      k.tensor_sum = tensor_sum;
                      out.push_back(KernelConfig{dtype, head_dim, mask, m, n, s, k});
                    }
  return out;
}

std::set<std::string> names(const std::vector<KernelConfig>& configs) {
  std::set<std::string> out;
  for (const auto& c : configs) out.insert(c.name());
  return out;
}

int sum_of(const std::map<std::string, int>& counts) {
  int sum = 0;
  for (const auto& [reason, count] : counts) sum += count;
  return sum;
}

}  // namespace

TEST_CASE("default forward space on sm_80 and sm_90: sizes, split and reasons", "[tuner][space]") {
  // The default knobs: 3 block_m x 6 block_n x 3 warps x 3 stages x 2 q_in_regs for the sm80 family,
  // and on sm_90 4 block_m x 9 block_n x 3 stages x 2 overlap x 2 pingpong x 2 persistent x 2 p_smem x 2
  // cluster x 2 groups x 2 tensor_sum for the sm90 family.
  constexpr int kSm80Total = 3 * 6 * 3 * 3 * 2;
  static_assert(kSm80Total == 324, "default ForwardKnobs product");
  const std::map<int, int> expected_total{{80, kSm80Total}, {90, kSm80Total + 4 * 9 * 3 * 128}};
  // Valid d128 configs, worked out by hand from fwd_traits.cuh. sm80 family: 39 (block_m, block_n,
  // warps, q_in_regs) combinations fit the registers at each of the 3 stage counts (117); shared memory
  // then drops 24 of them on sm_80's 163 KB and 8 on sm_90's 227 KB. sm90 family on sm_90: one or two
  // consumers fit every block_n in 240 registers, three fit block_n 64 and 80 in 160; 227 KB then keep
  // all of them at 2 stages, block_n <= 128 at 3 and <= 96 at 4 (17 + 17), and all six with three
  // consumers: 40, each with overlap off and on (80); pingpong adds the 17 two-consumer ones, twice
  // (114); persistent doubles them all (228). With P in shared memory (one 8 KB chunk per consumer and 64
  // keys; 24 registers for its stores instead of block_n / 4 for its pairs) three consumers still fit
  // block_n 64 and 80 only, and 227 KB keep 8, 5 and 3 block_n at 2, 3 and 4 stages with one consumer,
  // 6, 3 and 2 with two, 2, 2 and 1 with three (32), 11 more with pingpong, each with overlap and
  // persistent off and on (172). A cluster of two repeats them all but the
  // 8 with two consumers and block_n 192 in registers (its producer keeps 8 more registers, leaving each
  // consumer 232), without a mask, and none under a causal one. Two groups of consumers per persistent
  // block fit block_m 64 only (two 128-row groups would leave each consumer 112 registers), with 232
  // registers each and two groups' shared memory in 227 KB: block_n 64 at 2 and 3 stages, 80 and 96 at
  // 2, and with P in shared memory 64 and 80 at 2 (6), overlap off and on (12). The rows' sums from the
  // tensor cores (fp16 only) add 1 KB of ones per group: every single-group config still fits (400 and,
  // without a mask, the 392 clusters again), two groups only at 2 stages with block_n 64, 80, and 64 with P
  // in shared memory (6). Update these when the validity rules change.
  const int kSm90Single = 228 + 172;
  const std::map<int, int> expected_valid{{80, 93}, {90, 109 + kSm90Single + 12}};
  const int kTensorSums = kSm90Single + 6;  // fp16 only

  for (int arch : {80, 90})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal}) {
        const int head_dim = 128;
        INFO("sm_" << arch << " " << flashgen::dtype_name(dtype) << " causal=" << (mask == MaskKind::kCausal));
        const flashgen::SpaceReport report = flashgen::forward_space(dtype, head_dim, mask, arch);
        CHECK(report.total == expected_total.at(arch));
        CHECK(static_cast<int>(report.valid.size()) + report.pruned == report.total);
        const int sm90_clusters = arch == 90 && mask == MaskKind::kNone ? 228 - 8 + 172 : 0;
        const int sm90_tensor_sums = arch == 90 && dtype == DType::kFloat16 ? kTensorSums + sm90_clusters : 0;
        CHECK(static_cast<int>(report.valid.size()) == expected_valid.at(arch) + sm90_clusters + sm90_tensor_sums);
        CHECK(sum_of(report.pruned_by_reason) == report.pruned);

        for (const KernelConfig& c : report.valid) {
          INFO(c.name());
          CHECK(c.dtype == dtype);
          CHECK(c.head_dim == head_dim);
          CHECK(c.mask == mask);
          CHECK_FALSE(c.invalid_reason(arch).has_value());
        }

        // The same split and the same reason texts as asking invalid_reason of every config in the product.
        std::vector<KernelConfig> expected_list;
        std::map<std::string, int> expected_reasons;
        for (const KernelConfig& c : product(dtype, head_dim, mask, flashgen::ForwardKnobs{}, arch)) {
          if (auto why = c.invalid_reason(arch)) {
            ++expected_reasons[*why];
          } else {
            expected_list.push_back(c);
          }
        }
        CHECK(report.valid == expected_list);  // also pins the nesting order
        CHECK(report.pruned_by_reason == expected_reasons);
        for (const auto& [reason, count] : report.pruned_by_reason) {
          INFO(reason);
          CHECK(count > 0);
          CHECK_FALSE(reason.empty());
        }

        // The built-in choice is one of the valid configs.
        const KernelConfig heuristic = flashgen::heuristic_forward_config(dtype, head_dim, mask, arch);
        INFO("heuristic " << heuristic.name());
        CHECK(std::find(report.valid.begin(), report.valid.end(), heuristic) != report.valid.end());
      }
}

TEST_CASE("the heuristic choice is in the valid space for every standard head_dim", "[tuner][space]") {
  for (int arch : {80, 86, 90})
    for (int head_dim : {32, 64, 96, 128, 192, 256}) {
      const flashgen::SpaceReport report = flashgen::forward_space(DType::kBFloat16, head_dim, MaskKind::kCausal, arch);
      const KernelConfig heuristic = flashgen::heuristic_forward_config(DType::kBFloat16, head_dim, MaskKind::kCausal, arch);
      INFO("sm_" << arch << " " << heuristic.name());
      CHECK(report.total == (arch == 90 ? 324 + 13824 : 324));
      CHECK(static_cast<int>(report.valid.size()) + report.pruned == report.total);
      CHECK(std::find(report.valid.begin(), report.valid.end(), heuristic) != report.valid.end());
    }
}

TEST_CASE("sm_86's 99 KB of shared memory leaves a strict subset of sm_90's space", "[tuner][space]") {
  for (int head_dim : {64, 128, 256}) {
    INFO("d" << head_dim);
    const auto sm86 = flashgen::forward_space(DType::kFloat16, head_dim, MaskKind::kNone, 86);
    const auto sm90 = flashgen::forward_space(DType::kFloat16, head_dim, MaskKind::kNone, 90);
    CHECK(sm86.total + 13824 == sm90.total);  // the sm90 family is enumerated on sm_90 only
    const std::set<std::string> names86 = names(sm86.valid);
    const std::set<std::string> names90 = names(sm90.valid);
    CHECK(names86.size() < names90.size());
    CHECK(std::includes(names90.begin(), names90.end(), names86.begin(), names86.end()));
    // What sm_90 keeps and sm_86 drops, it drops for shared memory alone (the sm80 family).
    for (const KernelConfig& c : sm90.valid) {
      if (names86.count(c.name()) || c.family() == flashgen::KernelFamily::kSm90) continue;
      const auto why = c.invalid_reason(86);
      INFO(c.name());
      REQUIRE(why.has_value());
      CHECK(why->find("shared memory") != std::string::npos);
    }
  }
}

TEST_CASE("forward_space is deterministic", "[tuner][space]") {
  for (int arch : {80, 86, 90}) {
    const auto first = flashgen::forward_space(DType::kBFloat16, 96, MaskKind::kCausal, arch);
    const auto second = flashgen::forward_space(DType::kBFloat16, 96, MaskKind::kCausal, arch);
    CHECK(first.valid == second.valid);
    CHECK(first.total == second.total);
    CHECK(first.pruned == second.pruned);
    CHECK(first.pruned_by_reason == second.pruned_by_reason);
  }
}

TEST_CASE("custom knobs span only their own product", "[tuner][space]") {
  flashgen::ForwardKnobs one;
  one.block_m = {128};
  one.block_n = {32};
  one.warps = {4};
  one.stages = {3};
  one.q_in_regs = {false};
  const auto valid = flashgen::forward_space(DType::kFloat16, 128, MaskKind::kCausal, 80, one);
  CHECK(valid.total == 1);
  CHECK(valid.pruned == 0);
  CHECK(valid.pruned_by_reason.empty());
  REQUIRE(valid.valid.size() == 1);
  CHECK(valid.valid[0].name() == "fwd_sm80_fp16_d128_m128_n32_w4_s3_causal");

  // 64 rows cannot be split into whole 16-row tiles for 8 warps.
  one.block_m = {64};
  one.warps = {8};
  const auto pruned = flashgen::forward_space(DType::kFloat16, 128, MaskKind::kCausal, 80, one);
  CHECK(pruned.total == 1);
  CHECK(pruned.valid.empty());
  CHECK(pruned.pruned == 1);
  const KernelConfig bad{DType::kFloat16, 128, MaskKind::kCausal, 64, 32, 3, flashgen::Sm80Knobs{8, false}};
  REQUIRE(bad.invalid_reason(80).has_value());
  CHECK(pruned.pruned_by_reason == std::map<std::string, int>{{*bad.invalid_reason(80), 1}});

  // An empty knob leaves nothing to enumerate.
  one.stages.clear();
  const auto empty = flashgen::forward_space(DType::kFloat16, 128, MaskKind::kCausal, 80, one);
  CHECK(empty.total == 0);
  CHECK(empty.valid.empty());
  CHECK(empty.pruned == 0);
}

TEST_CASE("below sm_80 the whole space is pruned for one reason", "[tuner][space]") {
  const auto report = flashgen::forward_space(DType::kFloat16, 64, MaskKind::kNone, 75);
  CHECK(report.total == 324);
  CHECK(report.valid.empty());
  CHECK(report.pruned == 324);
  REQUIRE(report.pruned_by_reason.size() == 1);
  CHECK(report.pruned_by_reason.begin()->first == *KernelConfig{}.invalid_reason(75));
}

TEST_CASE("capped candidates: the built-in choice, its one-knob neighbours, then spread", "[tuner][space]") {
  const flashgen::SpaceReport space = flashgen::forward_space(DType::kFloat16, 128, MaskKind::kNone, 90);
  const flashgen::KernelConfig builtin =
      flashgen::heuristic_forward_config(DType::kFloat16, 128, MaskKind::kNone, 90);
  REQUIRE(builtin.family() == flashgen::KernelFamily::kSm90);
  auto knobs_differing = [&](const flashgen::KernelConfig& c) {  // the sm90 family's knobs
    if (c.family() != builtin.family()) return 100;
    const flashgen::Sm90Knobs& a = *c.sm90();
    const flashgen::Sm90Knobs& b = *builtin.sm90();
    return (c.block_m != builtin.block_m) + (c.block_n != builtin.block_n) + (c.stages != builtin.stages) +
           (a.overlap != b.overlap) + (a.pingpong != b.pingpong) + (a.persistent != b.persistent) +
           (a.p_smem != b.p_smem) + (a.cluster != b.cluster) + (a.groups != b.groups) +
           (a.tensor_sum != b.tensor_sum);
  };
  size_t neighbours = 0;
  for (const auto& c : space.valid) neighbours += knobs_differing(c) == 1;
  REQUIRE(neighbours >= 4);

  const auto picked = flashgen::capped_candidates(space, builtin, neighbours + 6);
  REQUIRE(picked.size() == neighbours + 6);
  CHECK(picked.front() == builtin);
  for (size_t i = 1; i <= neighbours; ++i) CHECK(knobs_differing(picked[i]) == 1);
  for (size_t i = neighbours + 1; i < picked.size(); ++i) CHECK(knobs_differing(picked[i]) > 1);
  for (size_t i = 0; i < picked.size(); ++i)
    for (size_t j = i + 1; j < picked.size(); ++j) CHECK(picked[i] != picked[j]);
  CHECK(flashgen::capped_candidates(space, builtin, neighbours + 6) == picked);  // deterministic

  const auto few = flashgen::capped_candidates(space, builtin, 3);
  REQUIRE(few.size() == 3);
  CHECK(few[0] == builtin);
  CHECK(knobs_differing(few[1]) == 1);
  const auto all = flashgen::capped_candidates(space, builtin, 100000);
  CHECK(all.size() == space.valid.size());  // the built-in is itself valid: nothing added twice
  CHECK(flashgen::capped_candidates(space, builtin, 0).empty());
}

TEST_CASE("backward space: both families on sm_90, the sm80 one elsewhere, dq tiles when deterministic",
          "[tuner][space][backward]") {
  const flashgen::BackwardKnobs knobs;
  const size_t sm80_product = knobs.block_m.size() * knobs.block_n.size() * knobs.warps.size() *
                              knobs.stages.size() * knobs.d_split.size();
  const size_t sm90_product = knobs.sm90_block_m.size() * knobs.sm90_block_n.size() * knobs.sm90_stages.size();
  const size_t dq_tiles = knobs.dq_block_m.size() * knobs.dq_block_n.size() * knobs.dq_warps.size();

  const auto atomic90 = flashgen::backward_space(DType::kFloat16, 128, MaskKind::kCausal, false, 90);
  CHECK(size_t(atomic90.total) == sm80_product + sm90_product);
  CHECK(size_t(atomic90.pruned) + atomic90.valid.size() == size_t(atomic90.total));
  int pruned_sum = 0;
  for (const auto& [reason, count] : atomic90.pruned_by_reason) pruned_sum += count;
  CHECK(pruned_sum == atomic90.pruned);
  size_t sm90_valid = 0;
  for (const flashgen::BwdConfig& c : atomic90.valid) {
    CHECK_FALSE(c.invalid_reason(90).has_value());
    CHECK(c.head_dim == 128);
    CHECK(c.mask == MaskKind::kCausal);
    CHECK_FALSE(c.deterministic);
    sm90_valid += c.family() == flashgen::KernelFamily::kSm90;
  }
  CHECK(sm90_valid == 4);  // d128: m64 n128 and m64 n64 (the query split) with 2 or 3 stages
  const flashgen::BwdConfig builtin = flashgen::heuristic_backward_config(DType::kFloat16, 128, MaskKind::kCausal, false, 90);
  CHECK(std::find(atomic90.valid.begin(), atomic90.valid.end(), builtin) != atomic90.valid.end());

  const auto atomic80 = flashgen::backward_space(DType::kFloat16, 128, MaskKind::kCausal, false, 80);
  CHECK(size_t(atomic80.total) == sm80_product);
  for (const flashgen::BwdConfig& c : atomic80.valid) CHECK(c.family() == flashgen::KernelFamily::kSm80);

  // The sm80 family's dq tiles multiply its dkdv configs; the sm90 family's deterministic strategy has
  // no dq kernel, so each of its configs appears once.
  const auto det90 = flashgen::backward_space(DType::kBFloat16, 64, MaskKind::kNone, true, 90);
  CHECK(size_t(det90.total) == sm80_product * dq_tiles + sm90_product);
  size_t det_sm90_valid = 0;
  for (const flashgen::BwdConfig& c : det90.valid) {
    CHECK(c.deterministic);
    CHECK(c.has_dq_kernel() == (c.family() == flashgen::KernelFamily::kSm80));
    det_sm90_valid += c.family() == flashgen::KernelFamily::kSm90;
  }
  CHECK(det_sm90_valid == 5);  // d64: m64 n64, m128 n64 with 2 or 3 stages; m128 n128 with 2

  // Capped: the built-in choice first, then its one-knob neighbours; deterministic order.
  const std::vector<flashgen::BwdConfig> capped = flashgen::capped_candidates(atomic90, builtin, 6);
  REQUIRE(capped.size() == 6);
  CHECK(capped.front() == builtin);
  // Its two neighbours: 3 stages, and 64 keys (the query split).
  REQUIRE(capped[1].family() == flashgen::KernelFamily::kSm90);
  REQUIRE(capped[2].family() == flashgen::KernelFamily::kSm90);
  CHECK(capped[1].block_n + capped[2].block_n == 128 + 64);
  CHECK(capped[1].stages + capped[2].stages == 3 + 2);
  CHECK(capped == flashgen::capped_candidates(atomic90, builtin, 6));
}

TEST_CASE("a values' head dim space: every family's configs with the values' dim", "[tuner][space][value_dim]") {
  for (int arch : {80, 90}) {
    const flashgen::SpaceReport keys_wide = flashgen::forward_space(DType::kBFloat16, 192, MaskKind::kCausal, arch);
    const flashgen::SpaceReport values = flashgen::forward_space(DType::kBFloat16, 192, MaskKind::kCausal, arch, {}, 128);
    CHECK(values.total == keys_wide.total);
    CHECK(values.pruned == values.total - static_cast<int>(values.valid.size()));
    REQUIRE_FALSE(values.valid.empty());
    size_t sm90 = 0;
    for (const flashgen::KernelConfig& c : values.valid) {
      CHECK(c.value_dim() == 128);
      sm90 += c.family() == flashgen::KernelFamily::kSm90;
    }
    CHECK((sm90 > 0) == (arch == 90));
    // The narrower output takes fewer registers: every tile of the 192-column space, and more.
    CHECK(values.valid.size() > keys_wide.valid.size());
  }
}

TEST_CASE("a packed space: every valid config as a varlen kernel, the dense prunes counted", "[tuner][space][varlen]") {
  for (int arch : {80, 90}) {
    const flashgen::SpaceReport dense = flashgen::forward_space(DType::kBFloat16, 128, MaskKind::kCausal, arch);
    const flashgen::SpaceReport packed = flashgen::packed_space(dense, arch);
    CHECK(packed.total == dense.total);
    CHECK(packed.pruned == packed.total - static_cast<int>(packed.valid.size()));
    size_t sm90 = 0;
    for (const flashgen::KernelConfig& c : packed.valid) {
      CHECK(c.varlen);
      if (const flashgen::Sm90Knobs* k = c.sm90()) {
        ++sm90;
        CHECK_FALSE((k->persistent || k->cluster != 1 || k->groups != 1));
      }
    }
    CHECK((arch == 90) == (sm90 > 0));
    // On sm_90 the persistent, clustered and grouped configs have no packed form.
    if (arch == 90) CHECK(packed.valid.size() < dense.valid.size());
    CHECK(packed.valid.size() <= dense.valid.size());
    const flashgen::BackwardSpaceReport backward =
        flashgen::packed_space(flashgen::backward_space(DType::kBFloat16, 128, MaskKind::kCausal, false, arch), arch);
    REQUIRE_FALSE(backward.valid.empty());
    size_t backward_sm90 = 0;
    for (const flashgen::BwdConfig& c : backward.valid) {
      CHECK(c.varlen);
      backward_sm90 += c.family() == flashgen::KernelFamily::kSm90;
    }
    CHECK(backward_sm90 == (arch == 90 ? 4u : 0u));  // d128: m64 n128 and m64 n64 with 2 or 3 stages
  }
}
