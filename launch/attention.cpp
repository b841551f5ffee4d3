// Forward launcher: validates tensor views and options into AttnFwdParams (no GPU needed); for a config it
// is given, checks the pointers against the launch context and what the kernel family can implement,
// computes the grid and launches on the caller's stream. Any bad input is reported before anything runs.
#include "launch/attention.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "launch/tensor_checks.hpp"
#include "launch/tile_counters.hpp"
#include "launch/tma.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/stream_memory.hpp"

namespace flashgen {

ForwardCall make_forward_call(const TensorView* q, const TensorView* k, const TensorView* v, const TensorView* out,
                              float* lse, const CallOptions* opts) {
  // FP8 q, k and v (one format) take a 16-bit output of their own type choice, and descales.
  check_tensor(q, "q", /*fp8_taken=*/true);
  check_tensor(k, "k", true);
  check_tensor(v, "v", true);
  check_tensor(out, "out");
  FLASHGEN_REQUIRE(opts != nullptr, "opts: null pointer");
  const bool fp8 = is_fp8(q->dtype);
  for (const auto& [t, name] : {std::pair{k, "k"}, std::pair{v, "v"}}) require_same_dtype(t, name, q);
  if (!fp8) require_same_dtype(out, "out", q);
  check_fp8_descales(*opts, fp8, "16-bit q, k and v (descales are an FP8 forward's)");
  require_same_dim(k, "k", q, "q", 0);
  require_same_dim(v, "v", q, "q", 0);
  require_same_dim(k, "k", q, "q", 3);
  require_same_dim(v, "v", k, "k", 1);
  require_same_dim(v, "v", k, "k", 2);
  for (int i = 0; i < 3; ++i) require_same_dim(out, "out", q, "q", i);

  check_head_dim_and_groups(q, k, /*max_head_dim=*/512);
  check_value_dim(v, "v", out, "out", q, /*own_dim_taken=*/!fp8);
  if (fp8 && (q->shape[3] % 16 != 0 || q->shape[3] > 256)) {
    fail(Status::kUnsupported, "q.shape[3] (head_dim) is " + std::to_string(q->shape[3]) +
                                   ": the FP8 forward takes multiples of 16 up to 256");
  }
  for (const auto& [t, name] : {std::pair{q, "q"}, std::pair{k, "k"}, std::pair{v, "v"}, std::pair{out, "out"}}) {
    check_layout(t, name);
  }
  check_output_strides(out, "out");
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(lse) % alignof(float) == 0,
                   "lse: pointer must be 4-byte aligned");
  check_options(opts, q->shape[2]);
  FLASHGEN_REQUIRE(q->shape[0] <= 65535 && q->shape[2] <= 65535,
                   "q: batch and heads must each be at most 65535 (grid limits)");

  ForwardCall call;
  call.problem = forward_problem(q->dtype, shape_of(q, k, v), opts->mask, opts->window_left, opts->window_right,
                                 opts->attention_chunk);
  call.problem.softcap = opts->softcap;
  call.problem.alibi = opts->alibi_slopes != nullptr;
  if (fp8) call.problem.out_dtype = out->dtype;

  AttnFwdParams& p = call.params;
  p.q = q->data;
  p.k = k->data;
  p.v = v->data;
  p.o = out->data;
  p.lse = lse;
  p.q_batch_stride = q->stride[0], p.q_row_stride = q->stride[1], p.q_head_stride = q->stride[2];
  p.k_batch_stride = k->stride[0], p.k_row_stride = k->stride[1], p.k_head_stride = k->stride[2];
  p.v_batch_stride = v->stride[0], p.v_row_stride = v->stride[1], p.v_head_stride = v->stride[2];
  p.o_batch_stride = out->stride[0], p.o_row_stride = out->stride[1], p.o_head_stride = out->stride[2];
  p.batch = static_cast<int>(q->shape[0]);
  p.seqlen_q = static_cast<int>(q->shape[1]);
  p.heads_q = static_cast<int>(q->shape[2]);
  p.seqlen_k = static_cast<int>(k->shape[1]);
  p.heads_kv = static_cast<int>(k->shape[2]);
  p.group_size = p.heads_q / p.heads_kv;
  bind_fp8_descales(*opts, p);
  set_user_variant(call.problem, *opts);
  p.variant = variant_args(call.problem, *opts, p.seqlen_q, p.seqlen_k);
  call.block_mask = user_block_mask(*opts, call.problem);
  return call;
}

namespace {

// A paged cache's k or v [num_pages, page_size, heads_kv, head_dim] checked as a tensor of its own, and seen as
// one batch entry of num_pages * page_size rows (the view the dense checks and the packing's take; the pages'
// own stride goes to the params).
TensorView paged_as_one_entry(const TensorView& t, const char* name) {
  check_tensor(&t, name, /*fp8_taken=*/true);  // the forward's checks then hold it to q's format
  check_layout(&t, name);
  FLASHGEN_REQUIRE(t.shape[1] % 16 == 0, std::string(name) + ".shape[1] (page_size) must be a multiple of 16 with a "
                                         "block_table, got " + std::to_string(t.shape[1]));
  FLASHGEN_REQUIRE(t.shape[0] <= INT32_MAX, std::string(name) + ".shape[0] (num_pages) must be at most 2^31 - 1");
  TensorView one = t;
  one.shape[0] = 1;
  one.shape[1] = std::min<int64_t>(t.shape[0] * t.shape[1], kMaxExtent);
  one.stride[0] = 0;
  return one;
}

}  // namespace

ForwardCall make_varlen_forward_call(const VarlenForwardArgs& args) {
  const bool paged = args.block_table != nullptr;
  TensorView k = args.k, v = args.v;
  if (paged) {
    k = paged_as_one_entry(args.k, "k");
    v = paged_as_one_entry(args.v, "v");
    require_same_dim(&args.v, "v", &args.k, "k", 0);
    require_same_dim(&args.v, "v", &args.k, "k", 1);
    FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(args.block_table) % alignof(int32_t) == 0,
                     "block_table: pointer must be 4-byte aligned");
    FLASHGEN_REQUIRE(args.max_pages >= 1 && args.max_pages * args.k.shape[1] <= kMaxExtent,
                     "max_pages must be at least 1, and max_pages * page_size at most 2^30, got " +
                         std::to_string(args.max_pages));
  }
  ForwardCall call = make_forward_call(&args.q, &k, &v, &args.out, args.lse, &args.options);
  const Packing packing{args.cu_seqlens_q, args.cu_seqlens_k, args.seqused_k,
                        args.batch,        args.max_seqlen_q, args.max_seqlen_k};
  check_packing(args.q, k, packing);
  AttnFwdParams& p = call.params;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;  // every sequence in entry 0
  bind_packing(packing, args.q, k, call.problem, p);
  if (paged) {
    const int64_t capacity = args.max_pages * args.k.shape[1];
    FLASHGEN_REQUIRE(args.max_seqlen_k <= capacity, "max_seqlen_k must be at most max_pages * page_size = " +
                                                        std::to_string(capacity) + ", got " +
                                                        std::to_string(args.max_seqlen_k));
    call.problem.paged = true;
    call.problem.page_size = static_cast<int>(args.k.shape[1]);
    call.problem.total_k = capacity;
    p.total_k = static_cast<int>(capacity);  // each sequence's key count is clamped to its pages
    p.block_table = args.block_table;
    p.block_table_stride = args.max_pages;
    p.k_page_stride = args.k.stride[0], p.v_page_stride = args.v.stride[0];
    p.page_size = static_cast<int>(args.k.shape[1]);
    p.num_pages = static_cast<int>(args.k.shape[0]);
    call.block_mask = user_block_mask(args.options, call.problem);  // refused over a paged cache
  }
  return call;
}

namespace {

// Encodes the TMA maps of a forward call's tensors into params.
void encode_tma_maps(const FwdTmaTensors& t, AttnFwdSm90Params& params) {
  encode_tma_map(&params.q_map, t.q, t.q_rows);
  encode_tma_map(&params.k_map, t.k, t.kv_rows);
  encode_tma_map(&params.v_map, t.v, t.v_rows);
  encode_tma_map(&params.o_map, t.o, FwdTmaTensors::kORows);
  if (t.v_fine) encode_tma_map(&params.v_fine_map, t.v, FwdTmaTensors::kFineRows);
}

// (batch, head) pairs per section of the tile list of a persistent kernel whose mask hides keys. As many as
// have their K and V (head_dim and value_dim columns of elem_bytes a key; shared by the query heads of a group) in
// half the L2
// cache, but enough for two tiles per walker (block or group of consumers), since the walkers running at once span
// about one section; then widened to even out the sections, so the last is not a narrow one whose longest tiles
// would start when the others are done.
int l2_section(const AttnFwdParams& p, int head_dim, int value_dim, int elem_bytes, int64_t m_blocks, int64_t walkers,
               const DeviceTraits& device) {
  const int64_t kv_bytes_per_pair =
      std::max<int64_t>(int64_t(p.seqlen_k) * (head_dim + value_dim) * elem_bytes / p.group_size, 1);
  const int64_t pairs = int64_t(p.heads_q) * p.batch;
  const int64_t widest = std::clamp<int64_t>(
      std::max<int64_t>(device.l2_bytes / 2 / kv_bytes_per_pair, (2 * walkers + m_blocks - 1) / m_blocks), 1, pairs);
  const int64_t sections = pairs / widest;
  return static_cast<int>((pairs + sections - 1) / sections);
}

// How many clusters of the prepared kernel (its cluster shape compiled in) fit on the device at once: GPCs
// of odd SM counts leave some SMs out of clusters of two. Falls back to half the SMs if the driver cannot say.
int max_active_clusters(const PreparedForward& prepared, const DeviceTraits& device) {
  CUlaunchConfig config{};
  config.gridDimX = 2;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = prepared.threads;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = prepared.smem_bytes;
  int clusters = 0;
  if (driver().cuOccupancyMaxActiveClusters(&clusters, prepared.function, &config) != CUDA_SUCCESS || clusters <= 0) {
    clusters = device.multiprocessors / 2;
  }
  return clusters;
}

void check_device_pointers(const AttnFwdParams& p, int device) {
  check_device_pointer(p.q, "q.data", device);
  check_device_pointer(p.k, "k.data", device);
  check_device_pointer(p.v, "v.data", device);
  check_device_pointer(p.o, "out.data", device);
  if (p.lse != nullptr) check_device_pointer(p.lse, "lse", device);
  if (p.cu_seqlens_q != nullptr) {
    check_device_pointer(p.cu_seqlens_q, "cu_seqlens_q", device);
    check_device_pointer(p.cu_seqlens_k, "cu_seqlens_k", device);
  }
  if (p.seqused_k != nullptr) check_device_pointer(p.seqused_k, "seqused_k", device);
  if (p.block_table != nullptr) check_device_pointer(p.block_table, "block_table", device);
  if (p.variant.alibi_slopes != nullptr) check_device_pointer(p.variant.alibi_slopes, "opts.alibi_slopes", device);
  if (p.variant.sinks != nullptr) check_device_pointer(p.variant.sinks, "opts.sinks", device);
  check_fp8_descale_pointers(p, device);
  check_user_buffers(p.variant, device);
}

}  // namespace

PreparedForward prepare_forward(const ForwardCall& call, CUstream stream, const KernelConfig& config) {
  const AttnFwdParams& p = call.params;
  const ScopedContext scope(stream, p.q);
  check_device_pointers(p, scope.device());
  const int arch = launch_arch(scope.device());
  const DeviceTraits& device = device_traits(scope.device());
  if (const Implementability answer = config.can_implement(call.problem, p, device); !answer) {
    fail_unimplementable(config.name(), answer);
  }

  PreparedForward prepared;
  prepared.config = config;
  prepared.arch = arch;
  prepared.params = p;
  prepared.block_mask = call.block_mask;
  if (config.family() == KernelFamily::kSm90) {
    prepared.uses_tma = true;
    prepared.sm90_params.base = p;
    const FwdTmaTensors tensors(call.problem, p, config);
    encode_tma_maps(tensors, prepared.sm90_params);
    if (is_fp8(config.dtype)) {  // Vᵀ's map, pointed at each launch's buffer (operator())
      // TMA's coordinates are int32: a paged batch's Vᵀ holds batch · max_seqlen_k keys (rounded up to 128).
      FLASHGEN_REQUIRE(config.values_t_keys(p) <= INT32_MAX,
                       "batch * max_seqlen_k is " + std::to_string(config.values_t_keys(p)) +
                           " keys of an FP8 call's Vᵀ, more than 2^31 - 1");
      prepared.values_t = KernelRegistry::instance().function(config, FwdKernel::kValuesT, scope.context(), arch);
      prepared.values_t_tensor = tensors.v;
      prepared.values_t_rows = tensors.v_rows;
    }
  }
  prepared.function = KernelRegistry::instance().function(config, FwdKernel::kAttend, scope.context(), arch);
  prepared.threads = static_cast<unsigned>(config.threads());
  prepared.smem_bytes = static_cast<unsigned>(config.smem_bytes());
  // A cluster of two takes pairs of query blocks: the grid's x is a multiple of 2, its last block
  // possibly past the end.
  const int cluster = config.cluster_size();
  const int64_t m_blocks = config.query_blocks(p);
  if (config.persistent()) {  // one block per SM (one cluster per SM pair) walks the tiles
    const int64_t resident = cluster > 1 ? max_active_clusters(prepared, device) : device.multiprocessors;
    prepared.grid[0] = static_cast<unsigned>(std::min<int64_t>(config.persistent_tiles(p), resident) * cluster);
  } else {
    prepared.grid[0] = static_cast<unsigned>((m_blocks + cluster - 1) / cluster * cluster);
    prepared.grid[1] = static_cast<unsigned>(p.heads_q);
    prepared.grid[2] = static_cast<unsigned>(p.batch);
  }
  // Only the persistent kernels of masks that hide keys (causal, window, a user's mask: tiles of unequal length)
  // claim tiles from a counter and walk a sectioned tile list; the others never read l2_section.
  // Walkers of a persistent kernel's tile list: its blocks, or their groups of consumers.
  const bool hides_keys = call.problem.mask_kind() != MaskKind::kNone || (config.user && config.user->masks());
  prepared.uses_tile_counter = config.persistent() && hides_keys;
  if (prepared.uses_tile_counter) {
    prepared.sm90_params.l2_section =
        l2_section(p, call.problem.head_dim(), call.problem.value_dim(), elem_bytes(call.problem.dtype), m_blocks,
                   int64_t(prepared.grid[0]) * config.sm90()->groups, device);
  }
  // A user mask's block classes, where their grids fit (else every block is walked with the mask, as without them).
  if (has_user_block_classes(config)) {
    const int class_heads = config.user->mask_same_for_heads ? 1 : p.heads_q;
    prepared.user_blocks =
        UserBlockLaunch::plan(config.block_m, config.block_n, static_cast<int>(std::min<int64_t>(m_blocks, INT32_MAX)),
                              (p.seqlen_k + config.block_n - 1) / config.block_n, class_heads, 1, p.batch, false);
    if (prepared.user_blocks) {
      prepared.user_blocks.tiles =
          KernelRegistry::instance().function(config, FwdKernel::kUserBlockTiles, scope.context(), arch);
      prepared.user_blocks.ranges =
          KernelRegistry::instance().function(config, FwdKernel::kUserBlockRanges, scope.context(), arch);
    }
  }
  return prepared;
}

void PreparedForward::rebind(const ForwardCall& call, int device) {
  const AttnFwdParams& p = call.params;
  check_device_pointers(p, device);
  params = p;
  block_mask = call.block_mask;
  if (!uses_tma) return;
  sm90_params.base = p;
  if (!tma_maps_retargetable()) {
    encode_tma_maps(FwdTmaTensors(call.problem, p, config), sm90_params);
    return;
  }
  retarget_tma_map(&sm90_params.q_map, p.q);
  retarget_tma_map(&sm90_params.k_map, p.k);
  if (values_t == nullptr) retarget_tma_map(&sm90_params.v_map, p.v);  // else pointed at Vᵀ per launch
  retarget_tma_map(&sm90_params.o_map, p.o);
  if (call.problem.paged && values_t == nullptr) retarget_tma_map(&sm90_params.v_fine_map, p.v);
}

void PreparedForward::operator()(CUstream stream) const {
  if (values_t == nullptr) {
    launch_with(stream, params, sm90_params);
    return;
  }
  // FP8: Vᵀ in stream-ordered memory, then the attention kernel reading it through v_map.
  StreamAllocation buffer(config.values_t_bytes(params), stream);
  AttnFwdParams with_values = params;
  with_values.v_t = reinterpret_cast<void*>(buffer.ptr());
  with_values.v_t_keys = config.values_t_keys(params);
  void* args[] = {&with_values};
  const unsigned blocks = static_cast<unsigned>(config.values_t_key_blocks(params));
  FLASHGEN_CU_CHECK(cuLaunchKernel(values_t, blocks, static_cast<unsigned>(params.heads_kv),
                                   static_cast<unsigned>(params.batch), kValuesThreads, 1, 1, 0, stream, args, nullptr));
  AttnFwdSm90Params sm90 = sm90_params;
  sm90.base = with_values;
  if (tma_maps_retargetable()) {
    retarget_tma_map(&sm90.v_map, with_values.v_t);
  } else {
    TmaTensor v_t = values_t_tensor;
    v_t.data = with_values.v_t;
    encode_tma_map(&sm90.v_map, v_t, values_t_rows);
  }
  launch_with(stream, with_values, sm90);
  buffer.release();
}

void PreparedForward::launch_with(CUstream stream, const AttnFwdParams& plain, const AttnFwdSm90Params& tma) const {
  if (!user_blocks) {
    launch_attention(stream, plain, tma);
    return;
  }
  if (block_mask != nullptr) {  // kept across calls: computed by the first
    AttnFwdParams with_classes = plain;
    void* args[] = {&with_classes};
    user_blocks.launch_kept(*block_mask, block_mask_key(config.name(), plain), with_classes.user_classes, stream,
                            args);
    AttnFwdSm90Params sm90 = tma;
    sm90.base = with_classes;
    launch_attention(stream, with_classes, sm90);
    return;
  }
  // The user mask's classes in stream order.
  StreamAllocation classes(user_blocks.bytes(), stream);
  AttnFwdParams with_classes = plain;
  with_classes.user_classes = user_blocks.at(classes.ptr());
  void* args[] = {&with_classes};
  user_blocks.launch(stream, args);
  AttnFwdSm90Params sm90 = tma;
  sm90.base = with_classes;
  launch_attention(stream, with_classes, sm90);
  classes.release();
}

void PreparedForward::launch_attention(CUstream stream, const AttnFwdParams& plain,
                                       const AttnFwdSm90Params& sm90) const {
  auto launch = [&](const void* kernel_params) {
    void* args[] = {const_cast<void*>(kernel_params)};
    FLASHGEN_CU_CHECK(cuLaunchKernel(function, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes, stream, args,
                                     nullptr));
  };
  if (!uses_tile_counter) {
    launch(uses_tma ? static_cast<const void*>(&sm90) : static_cast<const void*>(&plain));
    return;
  }
  AttnFwdSm90Params with_counter = sm90;
  if (const CUdeviceptr shared = stream_tile_counter(stream)) {
    with_counter.tile_counter = reinterpret_cast<int*>(shared);
    launch(&with_counter);
    return;
  }
  // A counter of this launch's own, zeroed in stream order (and captured with it into a graph).
  StreamAllocation owned(sizeof(int), stream);
  with_counter.tile_counter = reinterpret_cast<int*>(owned.ptr());
  FLASHGEN_CU_CHECK(cuMemsetD32Async(owned.ptr(), 0, 1, stream));
  launch(&with_counter);
  owned.release();
}

void launch_forward(const ForwardCall& call, CUstream stream, const KernelConfig& config) {
  const ScopedContext scope(stream, call.params.q);
  prepare_forward(call, stream, config)(stream);
}

}  // namespace flashgen
