// The sweep driver's non-template helpers: random inputs, sampled rows, failure text, L2-busting input sets.
#include "tuner/sweep_driver.hpp"

#include <memory>
#include <string>

#include "runtime/device_buffer.hpp"

namespace flashgen::sweep_driver {

std::vector<uint16_t> random_bits(size_t count, DType dtype, std::mt19937_64& rng) {
  // Normal samples cost ~25 ns each: a sweep's gigabyte-sized inputs take a pool of 2^20 of them, picked by a
  // xorshift stream seeded from rng (random values all the same, never a pattern a kernel could cache).
  constexpr size_t kPool = size_t{1} << 20;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> pool(std::min(count, kPool));
  for (auto& b : pool) b = float_to_dtype_bits(normal(rng), dtype);
  if (count <= kPool) return pool;
  std::vector<uint16_t> bits(count);
  uint64_t state = rng() | 1;
  for (auto& b : bits) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    b = pool[state & (kPool - 1)];
  }
  return bits;
}

// Rows checked against the reference: spread over (batch, head, position), always the last row.
std::vector<RowSample> sample_rows(const AttentionShape& p, int count) {
  std::vector<RowSample> rows;
  for (int i = 0; i < count; ++i) {
    rows.push_back({i % p.batch, (i * 7) % p.heads_q, (static_cast<int64_t>(i) * 2654435761u) % p.seqlen_q});
  }
  rows.push_back({p.batch - 1, p.heads_q - 1, p.seqlen_q - 1});
  return rows;
}

// "" when every report is ok, else the texts of those that are not (summary first, then the first mismatches).
std::string failures(const std::vector<const CheckReport*>& reports) {
  std::string text;
  for (const CheckReport* report : reports) {
    if (!report->ok) text += (text.empty() ? "" : "\n") + report->text;
  }
  return text;
}


int input_sets(CUdevice device, int64_t set_bytes) {
  int l2_bytes = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device));
  return set_bytes >= 2 * int64_t(l2_bytes)
             ? 1
             : static_cast<int>(std::min<int64_t>(8, (4 * int64_t(l2_bytes) + set_bytes - 1) / set_bytes));
}

AttentionProblem with_check_window(AttentionProblem small, const AttentionProblem& problem) {
  if (!problem.windowed()) return small;
  auto scaled = [&](int side) {
    if (side <= 0) return side;  // unbounded, or the diagonal itself
    const double ratio = double(small.shape.seqlen_k) / double(problem.shape.seqlen_k);
    return static_cast<int>(std::max<int64_t>(1, std::llround(side * std::min(1.0, ratio))));
  };
  small.set_mask(Mask::kSlidingWindow, scaled(problem.window_left), scaled(problem.window_right),
                 scaled(problem.attention_chunk));
  return small;
}

CallOptions sweep_options(const AttentionProblem& problem, DeviceBuffer& slopes, const UserVariantArgs* user_args) {
  CallOptions options = call_options(problem);
  if (problem.alibi) {
    const std::vector<float> host = variant_of(problem).alibi_slopes;
    slopes = DeviceBuffer(host.size() * sizeof(float));
    slopes.upload(host);
    options.alibi_slopes = static_cast<const float*>(slopes.data());
  }
  if (problem.user) {
    FLASHGEN_REQUIRE(user_args != nullptr,
                     "a sweep of a user variant needs the call's buffers and scalars of it");
    FLASHGEN_REQUIRE(user_args->buffers.size() == problem.user->buffers.size() &&
                         user_args->scalars.size() == problem.user->scalars.size(),
                     "a sweep of the user variant " + problem.user->tag + " was given " +
                         std::to_string(user_args->buffers.size()) + " buffers and " +
                         std::to_string(user_args->scalars.size()) + " scalars; it declares " +
                         std::to_string(problem.user->buffers.size()) + " and " +
                         std::to_string(problem.user->scalars.size()));
    options.variant = problem.user;
    options.variant_buffers = user_args->buffers.empty() ? nullptr : user_args->buffers.data();
    options.variant_scalars = user_args->scalars.empty() ? nullptr : user_args->scalars.data();
  }
  return options;
}

void without_user(SweepResult& result) {
  for (CandidateResult& c : result.candidates) set_user(c.config, nullptr);
  set_user(result.winner, nullptr);
}

ForwardOutputs checked_forward_run(const ForwardCall& call, const KernelConfig& config, DeviceBuffer& out,
                                   DeviceBuffer& lse, CUstream stream) {
  out.fill_bytes(0xff, stream);
  lse.fill_bytes(0xff, stream);
  launch_forward(call, stream, config);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  ForwardOutputs read{std::vector<uint16_t>(out.bytes() / 2), std::vector<float>(lse.bytes() / sizeof(float))};
  out.download(read.out.data(), read.out.size() * 2);
  lse.download(read.lse.data(), read.lse.size() * sizeof(float));
  return read;
}

std::function<void(int)> forward_launches(const std::vector<ForwardCall>& calls, const KernelConfig& config,
                                          CUstream stream) {
  auto prepared = std::make_shared<std::vector<PreparedForward>>();
  for (const ForwardCall& call : calls) prepared->push_back(prepare_forward(call, stream, config));
  return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()](stream); };
}

std::function<void(int)> backward_launches(const std::vector<const BackwardCall*>& calls, const BwdConfig& config,
                                           CUstream stream) {
  struct Prepared {
    PreparedBackward launch;
    DeviceBuffer workspace;
  };
  auto prepared = std::make_shared<std::vector<Prepared>>();
  for (const BackwardCall* call : calls) {
    Prepared p{prepare_backward(*call, stream, config), DeviceBuffer()};
    p.workspace = DeviceBuffer(p.launch.workspace_bytes);
    p.launch.bind_workspace(reinterpret_cast<CUdeviceptr>(p.workspace.data()));
    prepared->push_back(std::move(p));
  }
  return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()].launch(stream); };
}

}  // namespace flashgen::sweep_driver
