// A user variant's functions evaluated on the GPU for the float64 references (tuner/user_reference.hpp).
#include "tuner/user_reference.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace flashgen {

namespace {

// The points a reference asks, a whole row of keys per (batch, head, query) it asks any key of: a row's slot,
// then its keys. The scores a row's keys were asked at (0 where none was).
struct Points {
  const AttentionShape& shape;
  std::unordered_map<int64_t, int64_t> slot_of;  // (batch, head, query) as one index -> slot
  std::vector<int64_t> rows;                     // slot -> (batch, head, query) as one index
  std::vector<float> scores;                     // slot * seqlen_k + key

  explicit Points(const AttentionShape& s) : shape(s) {}

  int64_t row_index(int64_t b, int64_t h, int64_t i) const { return (b * shape.heads_q + h) * shape.seqlen_q + i; }

  // The slot of a row, made on the first ask.
  int64_t add(int64_t b, int64_t h, int64_t i) {
    const auto [found, made] = slot_of.emplace(row_index(b, h, i), static_cast<int64_t>(rows.size()));
    if (made) {
      rows.push_back(found->first);
      scores.resize(scores.size() + static_cast<size_t>(shape.seqlen_k), 0.f);
    }
    return found->second;
  }
  // The table index of a point asked before.
  size_t at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const auto found = slot_of.find(row_index(b, h, i));
    FLASHGEN_REQUIRE(found != slot_of.end(), "user variant reference: a point the first run did not ask");
    return static_cast<size_t>(found->second * shape.seqlen_k + j);
  }
};

// The functions' answers at every point of points.
struct Tables {
  std::vector<unsigned char> visible;
  std::vector<float> modified, gradient;
};

Tables evaluate(const UserVariant& user, const UserVariantArgs& args, const Points& points, CUstream stream) {
  const ScopedContext scope(stream);
  const int64_t keys = points.shape.seqlen_k;
  const int64_t heads = points.shape.heads_q, queries = points.shape.seqlen_q;
  const size_t count = points.rows.size() * static_cast<size_t>(keys);
  Tables tables;
  if (count == 0) return tables;
  std::vector<int> coordinates(4 * count);
  for (size_t slot = 0; slot < points.rows.size(); ++slot) {
    const int64_t row = points.rows[slot];
    for (int64_t j = 0; j < keys; ++j) {
      int* point = &coordinates[4 * (slot * static_cast<size_t>(keys) + static_cast<size_t>(j))];
      point[0] = static_cast<int>(row / (heads * queries));
      point[1] = static_cast<int>(row / queries % heads);
      point[2] = static_cast<int>(row % queries);
      point[3] = static_cast<int>(j);
    }
  }
  DeviceBuffer device_points(coordinates.size() * sizeof(int)), device_scores(count * sizeof(float));
  DeviceBuffer visible(count), modified(count * sizeof(float)), gradient(count * sizeof(float));
  device_points.upload(coordinates);
  device_scores.upload(points.scores);

  UserTableParams params{};
  FLASHGEN_REQUIRE(args.buffers.size() <= std::size(params.user_buffers) &&
                       args.scalars.size() <= std::size(params.user_scalars),
                   "user variant reference: more buffers or scalars than a kernel takes");
  std::copy(args.buffers.begin(), args.buffers.end(), params.user_buffers);
  std::copy(args.scalars.begin(), args.scalars.end(), params.user_scalars);
  params.points = static_cast<const int*>(device_points.data());
  params.scores = static_cast<const float*>(device_scores.data());
  params.count = static_cast<long long>(count);
  params.visible = static_cast<unsigned char*>(visible.data());
  params.modified = static_cast<float*>(modified.data());
  params.gradient = static_cast<float*>(gradient.data());

  const CompiledKernel compiled = compile_nvrtc(generate_user_table(user), device_sm(scope.device()));
  struct Module {
    CUmodule handle = nullptr;
    ~Module() {
      if (handle != nullptr) driver().cuModuleUnload(handle);
    }
  } module;
  FLASHGEN_CU_CHECK(cuModuleLoadData(&module.handle, compiled.cubin.data()));
  CUfunction function = nullptr;
  FLASHGEN_CU_CHECK(cuModuleGetFunction(&function, module.handle, compiled.kernel_name.c_str()));
  void* kernel_args[] = {&params};
  constexpr unsigned kThreads = 256;
  const unsigned blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  FLASHGEN_CU_CHECK(cuLaunchKernel(function, blocks, 1, 1, kThreads, 1, 1, 0, stream, kernel_args, nullptr));
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  tables.visible = visible.download_all<unsigned char>();
  tables.modified = modified.download_all<float>();
  tables.gradient = gradient.download_all<float>();
  return tables;
}

}  // namespace

void with_user_functions(const UserVariant& user, const UserVariantArgs& args, const AttentionShape& shape,
                         ReferenceVariant base, CUstream stream,
                         const std::function<void(const ReferenceVariant&)>& reference) {
  const bool score_mod = !user.score_mod.empty(), bias = !user.score_bias.empty();
  Points points(shape);
  ReferenceVariant recording = base;
  if (user.masks()) {
    recording.user_mask = [&](int64_t b, int64_t h, int64_t i, int64_t) {
      points.add(b, h, i);
      return true;
    };
  }
  if (score_mod || bias) {
    recording.user_score = [&](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
      points.scores[static_cast<size_t>(points.add(b, h, i) * shape.seqlen_k + j)] = static_cast<float>(s);
      return s;
    };
  }
  reference(recording);

  const Tables tables = evaluate(user, args, points, stream);
  ReferenceVariant answering = std::move(base);
  if (user.masks()) {
    answering.user_mask = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
      return tables.visible[points.at(b, h, i, j)] != 0;
    };
  }
  if (score_mod) {
    answering.user_score = [&](double, int64_t b, int64_t h, int64_t i, int64_t j) {
      return static_cast<double>(tables.modified[points.at(b, h, i, j)]);
    };
    if (!user.score_grad.empty()) {
      answering.user_score_grad = [&](double, int64_t b, int64_t h, int64_t i, int64_t j) {
        return static_cast<double>(tables.gradient[points.at(b, h, i, j)]);
      };
    }
  } else if (bias) {
    answering.user_score = [&](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
      return s + static_cast<double>(tables.modified[points.at(b, h, i, j)]);
    };
  }
  reference(answering);
}

}  // namespace flashgen
