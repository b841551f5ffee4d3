// KV-cache launcher: validates KvCacheArgs into AttnDecodeParams (no GPU needed); for a config and
// split count it is given, checks the pointers against the launch context, computes the grids and queues the
// append, attention and combine kernels on the caller's stream. Bad input is reported before anything runs.
#include "launch/attention_kvcache.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "flashgen/error.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/stream_memory.hpp"

namespace flashgen {

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// A latent cache (MLA): v_cache is a view of k_cache's first columns, whose dims the latent kernel takes.
void check_latent_values(const TensorView& q, const TensorView& vc, const TensorView& kc) {
  const int64_t head_dim = kc.shape[3], dim_v = vc.shape[3];
  const bool view = vc.data == kc.data && vc.stride[0] == kc.stride[0] && vc.stride[1] == kc.stride[1] &&
                    vc.stride[2] == kc.stride[2] && vc.shape[0] == kc.shape[0] && vc.shape[1] == kc.shape[1] &&
                    vc.shape[2] == kc.shape[2];
  FLASHGEN_REQUIRE(view, dim("v_cache", 3) + " is " + std::to_string(dim_v) + " but " + dim("k_cache", 3) + " is " +
                             std::to_string(head_dim) +
                             ": values of a head dim of their own are read as the first columns of the keys (a "
                             "latent cache, as MLA's): v_cache must be a view of k_cache's first " +
                             std::to_string(dim_v) + " columns (same data and strides)");
  if (head_dim % 64 != 0 || head_dim < 192 || head_dim > 576) {
    fail(Status::kUnsupported, dim("k_cache", 3) + " = " + std::to_string(head_dim) +
                                   " is unsupported for a latent cache: keys must be a multiple of 64 in [192, 576]");
  }
  if (dim_v % 128 != 0 || dim_v > 512 || dim_v + 64 > head_dim) {
    fail(Status::kUnsupported, dim("v_cache", 3) + " = " + std::to_string(dim_v) +
                                   " is unsupported for a latent cache: the values must be a multiple of 128 up to "
                                   "512 and leave the keys 64 columns of their own at least (" +
                                   dim("k_cache", 3) + " = " + std::to_string(head_dim) + ")");
  }
  FLASHGEN_REQUIRE(q.shape[2] % kc.shape[2] == 0, dim("q", 2) + " = " + std::to_string(q.shape[2]) +
                                                      " must be a multiple of " + dim("k_cache", 2) + " = " +
                                                      std::to_string(kc.shape[2]));
}

// An FP8 cache: keys and values of one format, new tokens of q's type, a head dim its fragments serve, not latent.
void check_fp8_cache(const TensorView& kc, const TensorView& vc, bool latent) {
  FLASHGEN_REQUIRE(vc.dtype == kc.dtype, std::string("v_cache.dtype is ") + dtype_name(vc.dtype) +
                                             " but k_cache.dtype is " + dtype_name(kc.dtype) +
                                             ": an FP8 cache's keys and values share one format");
  if (latent) {
    fail(Status::kUnsupported, std::string("k_cache.dtype is ") + dtype_name(kc.dtype) +
                                   ": a latent cache (values of a head dim of their own) is read in 16 bits only");
  }
  if (kc.shape[3] % 32 != 0) {
    fail(Status::kUnsupported, dim("k_cache", 3) + " = " + std::to_string(kc.shape[3]) + " is unsupported for an " +
                                   "FP8 cache: its head dim must be a multiple of 32");
  }
}


}  // namespace

KvCacheCall make_kvcache_call(const KvCacheArgs& args) {
  const TensorView& q = args.q;
  const TensorView& kc = args.k_cache;
  const TensorView& vc = args.v_cache;
  check_tensor(&q, "q");
  check_tensor(&kc, "k_cache", /*fp8_taken=*/true);
  check_tensor(&vc, "v_cache", /*fp8_taken=*/true);
  check_tensor(&args.out, "out");
  check_options(&args.options, q.shape[2]);
  require_same_dim(&kc, "k_cache", &q, "q", 3);
  // Values of a head dim of their own are a latent cache's (MLA): the keys' first columns, v_cache a view of k_cache.
  const bool latent = vc.shape[3] != kc.shape[3];
  const bool fp8 = is_fp8(kc.dtype);
  if (fp8) {
    check_fp8_cache(kc, vc, latent);
  } else {
    require_same_dtype(&kc, "k_cache", &q);
    require_same_dtype(&vc, "v_cache", &q);
  }
  require_same_dtype(&args.out, "out", &q);
  check_fp8_scales(args.k_scale, args.k_scale_stride, "k_scale", fp8, "a 16-bit cache (scales are an FP8 cache's)");
  check_fp8_scales(args.v_scale, args.v_scale_stride, "v_scale", fp8, "a 16-bit cache (scales are an FP8 cache's)");
  if (latent) {
    check_latent_values(q, vc, kc);
    FLASHGEN_REQUIRE(args.out.shape[3] == vc.shape[3], dim("out", 3) + " is " + std::to_string(args.out.shape[3]) +
                                                           " but " + dim("v_cache", 3) + " is " +
                                                           std::to_string(vc.shape[3]) +
                                                           ": the output has the values' head dim");
  } else {
    check_value_dim(&vc, "v_cache", &args.out, "out", &q, /*own_dim_taken=*/false);
    check_head_dim_and_groups(&q, &kc, /*max_head_dim=*/256);  // the sm80 decode's
  }
  for (int i = 0; i < 4; ++i) {
    if (i < 3 || !latent) require_same_dim(&args.out, "out", &q, "q", i);
    if (i < 3) require_same_dim(&vc, "v_cache", &kc, "k_cache", i);
  }
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&kc, "k_cache"}, std::pair{&vc, "v_cache"},
                                std::pair{&args.out, "out"}}) {
    check_layout(t, name);
  }
  check_output_strides(&args.out, "out");
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(args.lse) % alignof(float) == 0,
                   "lse: pointer must be 4-byte aligned");
  const int64_t batch = q.shape[0];
  FLASHGEN_REQUIRE(batch <= 65535, "q.shape[0] (batch) must be at most 65535 (grid limits), got " +
                                       std::to_string(batch));

  const bool paged = args.block_table != nullptr;
  int64_t capacity = kc.shape[1];
  if (paged) {
    FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(args.block_table) % alignof(int32_t) == 0,
                     "block_table: pointer must be 4-byte aligned");
    FLASHGEN_REQUIRE(kc.shape[1] % 16 == 0, "k_cache.shape[1] (page_size) must be a multiple of 16 for a paged cache, "
                                            "got " + std::to_string(kc.shape[1]));
    FLASHGEN_REQUIRE(kc.shape[0] <= INT_MAX, "k_cache.shape[0] (num_pages) must be at most 2^31 - 1");
    FLASHGEN_REQUIRE(args.max_pages >= 1 && args.max_pages <= kMaxExtent,
                     "max_pages must be in [1, 2^30] with a block_table, got " + std::to_string(args.max_pages));
    capacity = args.max_pages * kc.shape[1];
    FLASHGEN_REQUIRE(capacity <= kMaxExtent, "max_pages * page_size (the keys a sequence can hold) must be at most "
                                             "2^30, got " + std::to_string(capacity));
    // Pages written by the append must not share memory.
    if (args.k_new.data != nullptr) {
      check_output_strides(&kc, "k_cache");
      if (!latent) check_output_strides(&vc, "v_cache");
    }
  } else {
    FLASHGEN_REQUIRE(kc.shape[0] == batch, "k_cache.shape[0] (batch) is " + std::to_string(kc.shape[0]) +
                                               " but q.shape[0] (batch) is " + std::to_string(batch) +
                                               " (a contiguous cache holds one row of keys per sequence)");
  }

  int64_t seqlen_new = 0;
  const bool appends = args.k_new.data != nullptr;
  if (latent) {
    FLASHGEN_REQUIRE(args.v_new.data == nullptr, "v_new: a latent cache's new values are k_new's first " +
                                                     std::to_string(vc.shape[3]) + " columns; pass k_new alone");
  } else {
    FLASHGEN_REQUIRE(appends == (args.v_new.data != nullptr),
                     appends ? "v_new.data: null pointer, but k_new is given (append both or neither)"
                             : "k_new.data: null pointer, but v_new is given (append both or neither)");
  }
  if (appends) {
    check_tensor(&args.k_new, "k_new");
    require_same_dtype(&args.k_new, "k_new", &q);
    require_same_dim(&args.k_new, "k_new", &q, "q", 0);
    require_same_dim(&args.k_new, "k_new", &kc, "k_cache", 2);
    require_same_dim(&args.k_new, "k_new", &kc, "k_cache", 3);
    check_layout(&args.k_new, "k_new");
    if (!latent) {
      check_tensor(&args.v_new, "v_new");
      require_same_dtype(&args.v_new, "v_new", &q);
      for (int i = 0; i < 4; ++i) require_same_dim(&args.v_new, "v_new", &args.k_new, "k_new", i);
      check_layout(&args.v_new, "v_new");
    }
    if (!paged) {
      check_output_strides(&kc, "k_cache");
      if (!latent) check_output_strides(&vc, "v_cache");
    }
    seqlen_new = args.k_new.shape[1];
    FLASHGEN_REQUIRE(args.cache_seqlens != nullptr,
                     "cache_seqlens: null pointer, but k_new is given (the new keys go after each cache's filled rows)");
    FLASHGEN_REQUIRE(seqlen_new <= capacity, "k_new.shape[1] (seqlen_new) is " + std::to_string(seqlen_new) +
                                                 ", more than a sequence's cache holds (" + std::to_string(capacity) +
                                                 " keys)");
  }
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(args.cache_seqlens) % alignof(int32_t) == 0,
                   "cache_seqlens: pointer must be 4-byte aligned");
  FLASHGEN_REQUIRE(args.num_splits >= 0 && args.num_splits <= kMaxDecodeSplits,
                   "num_splits must be in [0, " + std::to_string(kMaxDecodeSplits) + "] (0: chosen), got " +
                       std::to_string(args.num_splits));
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(args.workspace) % kWorkspacePartAlignment == 0,
                   "workspace: pointer must be " + std::to_string(kWorkspacePartAlignment) + "-byte aligned");

  KvCacheCall call;
  AttentionShape shape;
  shape.batch = batch, shape.seqlen_q = q.shape[1], shape.seqlen_k = capacity;
  shape.heads_q = q.shape[2], shape.heads_kv = kc.shape[2], shape.head_dim = q.shape[3];
  if (latent) shape.head_dim_v = vc.shape[3];
  call.problem = forward_problem(q.dtype, shape, args.options.mask, args.options.window_left,
                                 args.options.window_right, args.options.attention_chunk);
  call.problem.kv_cache = true;
  call.problem.paged = paged;
  call.problem.softcap = args.options.softcap;
  call.problem.alibi = args.options.alibi_slopes != nullptr;
  call.problem.page_size = paged ? static_cast<int>(kc.shape[1]) : 0;
  if (fp8) call.problem.cache_dtype = kc.dtype;
  call.num_splits = static_cast<int>(args.num_splits);
  call.workspace = reinterpret_cast<CUdeviceptr>(args.workspace);
  call.workspace_bytes = args.workspace == nullptr ? 0 : args.workspace_bytes;

  AttnDecodeParams& p = call.params;
  p.q = q.data;
  p.k_cache = kc.data;
  p.v_cache = vc.data;
  p.o = args.out.data;
  p.lse = args.lse;
  p.cache_seqlens = args.cache_seqlens;
  p.block_table = args.block_table;
  p.q_batch_stride = q.stride[0], p.q_row_stride = q.stride[1], p.q_head_stride = q.stride[2];
  p.k_batch_stride = kc.stride[0], p.k_row_stride = kc.stride[1], p.k_head_stride = kc.stride[2];
  p.v_batch_stride = vc.stride[0], p.v_row_stride = vc.stride[1], p.v_head_stride = vc.stride[2];
  p.o_batch_stride = args.out.stride[0], p.o_row_stride = args.out.stride[1], p.o_head_stride = args.out.stride[2];
  if (appends) {
    const TensorView& kn = args.k_new;
    p.k_new = kn.data;
    p.kn_batch_stride = kn.stride[0], p.kn_row_stride = kn.stride[1], p.kn_head_stride = kn.stride[2];
    if (!latent) {
      const TensorView& vn = args.v_new;
      p.v_new = vn.data;
      p.vn_batch_stride = vn.stride[0], p.vn_row_stride = vn.stride[1], p.vn_head_stride = vn.stride[2];
    }
  }
  p.block_table_stride = paged ? args.max_pages : 0;
  p.k_scale = args.k_scale, p.v_scale = args.v_scale;
  p.k_scale_batch_stride = args.k_scale_stride[0], p.k_scale_head_stride = args.k_scale_stride[1];
  p.v_scale_batch_stride = args.v_scale_stride[0], p.v_scale_head_stride = args.v_scale_stride[1];
  p.batch = static_cast<int>(batch);
  p.heads_q = static_cast<int>(q.shape[2]);
  p.heads_kv = static_cast<int>(kc.shape[2]);
  p.group_size = p.heads_q / p.heads_kv;
  p.seqlen_q = static_cast<int>(q.shape[1]);
  p.seqlen_new = static_cast<int>(seqlen_new);
  p.capacity = static_cast<int>(capacity);
  p.page_size = paged ? static_cast<int>(kc.shape[1]) : 0;
  p.num_pages = paged ? static_cast<int>(kc.shape[0]) : 0;
  // A window is aligned bottom-right, as the bottom-right causal mask is (and (-1, 0) runs as that mask).
  p.causal_bottom_right = aligned_bottom_right(call.problem) ? 1 : 0;
  set_user_variant(call.problem, args.options);
  p.variant = variant_args(call.problem, args.options, p.seqlen_q, p.capacity);
  user_block_mask(args.options, call.problem);  // refused: decoding keeps no classes
  FLASHGEN_REQUIRE(int64_t(p.group_size) * p.seqlen_q <= kMaxExtent,
                   "q: heads_q / heads_kv * seqlen_q query rows per kv head must be at most 2^30");
  return call;
}

int clamp_splits(const KvCacheCall& call, const DecodeConfig& config, int splits) {
  return std::clamp(splits, 1, max_decode_splits(call.problem, config));
}

size_t kvcache_workspace_bytes(const KvCacheCall& call, const DecodeConfig& config, int splits) {
  AttnDecodeParams split = call.params;
  split.splits = splits;
  return config.workspace(split).bytes;
}

namespace {

void check_device_pointers(const AttnDecodeParams& p, int device) {
  check_device_pointer(p.q, "q.data", device);
  check_device_pointer(p.k_cache, "k_cache.data", device);
  check_device_pointer(p.v_cache, "v_cache.data", device);
  check_device_pointer(p.o, "out.data", device);
  if (p.lse != nullptr) check_device_pointer(p.lse, "lse", device);
  if (p.cache_seqlens != nullptr) check_device_pointer(p.cache_seqlens, "cache_seqlens", device);
  if (p.block_table != nullptr) check_device_pointer(p.block_table, "block_table", device);
  if (p.variant.sinks != nullptr) check_device_pointer(p.variant.sinks, "options.sinks", device);
  if (p.variant.alibi_slopes != nullptr) check_device_pointer(p.variant.alibi_slopes, "options.alibi_slopes", device);
  if (p.k_scale != nullptr) check_device_pointer(p.k_scale, "k_scale", device);
  if (p.v_scale != nullptr) check_device_pointer(p.v_scale, "v_scale", device);
  check_user_buffers(p.variant, device);
  if (p.k_new != nullptr) {
    check_device_pointer(p.k_new, "k_new.data", device);
    if (p.v_new != nullptr) check_device_pointer(p.v_new, "v_new.data", device);
  }
}

}  // namespace

PreparedKvCache prepare_kvcache(const KvCacheCall& call, CUstream stream, const DecodeConfig& config, int splits) {
  const AttnDecodeParams& p = call.params;
  const ScopedContext scope(stream, p.q);
  const int device = scope.device();
  check_device_pointers(p, device);
  const int arch = launch_arch(device);
  if (call.problem.cache_dtype && arch < 89) {
    fail(Status::kUnsupported, std::string("k_cache.dtype is ") + dtype_name(*call.problem.cache_dtype) +
                                   ": an FP8 cache needs sm_89 or newer (FP8 conversions); this GPU is sm_" +
                                   std::to_string(arch));
  }
  if (const Implementability answer = config.can_implement(call.problem, p, device_traits(device)); !answer) {
    fail_unimplementable(config.name(), answer);
  }

  PreparedKvCache prepared;
  prepared.config = config;
  prepared.arch = arch;
  prepared.splits = clamp_splits(call, config, splits);
  prepared.params = p;
  prepared.params.splits = prepared.splits;
  prepared.params.row_blocks = static_cast<int>(config.row_blocks(p));
  prepared.workspace_bytes = config.workspace(prepared.params).bytes;

  KernelRegistry& registry = KernelRegistry::instance();
  const CUcontext ctx = scope.context();
  prepared.attend = registry.function(config, DecodeKernel::kAttend, ctx, arch);
  prepared.attend_grid[0] = static_cast<unsigned>(prepared.splits);
  prepared.attend_grid[1] = static_cast<unsigned>(prepared.params.row_blocks * p.heads_kv);
  prepared.attend_grid[2] = static_cast<unsigned>(p.batch);
  prepared.attend_threads = static_cast<unsigned>(config.threads(DecodeKernel::kAttend));
  prepared.attend_smem_bytes = static_cast<unsigned>(config.smem_bytes(DecodeKernel::kAttend));
  if (p.seqlen_new > 0) {
    prepared.append = registry.function(config, DecodeKernel::kAppend, ctx, arch);
    const long long items = static_cast<long long>(p.seqlen_new) * p.heads_kv * (config.head_dim / 8);  // 16 B each
    prepared.append_grid[0] = static_cast<unsigned>(ceil_div(items, kDecodeRowKernelThreads));
    prepared.append_grid[1] = static_cast<unsigned>(p.batch);
  }
  if (prepared.splits > 1) {
    prepared.combine = registry.function(config, DecodeKernel::kCombine, ctx, arch);
    // Every (batch, head, query) row combines its ranges' partials.
    const long long rows = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
    prepared.combine_grid = static_cast<unsigned>(ceil_div(rows, kDecodeRowKernelThreads / 32));
  }
  return prepared;
}

void PreparedKvCache::rebind(const KvCacheCall& call, int device) {
  check_device_pointers(call.params, device);
  const int kept_splits = params.splits, kept_row_blocks = params.row_blocks;
  params = call.params;
  params.splits = kept_splits, params.row_blocks = kept_row_blocks;
}

void PreparedKvCache::operator()(CUstream stream, CUdeviceptr workspace) const {
  AttnDecodeParams bound = params;
  if (splits > 1) {
    const DecodeWorkspace layout = config.workspace(params);
    bound.o_partial = reinterpret_cast<float*>(workspace_part(workspace, layout.o_partial));
    bound.lse_partial = reinterpret_cast<float*>(workspace_part(workspace, layout.lse_partial));
  }
  void* args[] = {&bound};
  const unsigned row_threads = kDecodeRowKernelThreads;
  // On sm_90 the attention and combine kernels are launched as dependents of the kernel before them in the stream
  // (the append kernel, or whatever came before; the attention kernel), their launch hidden behind its end; neither
  // reads anything before that kernel is done and its memory visible (griddepcontrol.wait). The attention kernel lets
  // its combine kernel start at once; the combine kernel lets no dependent start early: a next call's attention
  // blocks placed beside its blocks ran slower (bench/notes_decode.md, Versions: the dependent launch).
  const bool dependent_launch = arch >= 90;
  if (append != nullptr) launch_kernel(append, {append_grid[0], append_grid[1], 1}, row_threads, 0, stream, args);
  launch_kernel(attend, attend_grid, attend_threads, attend_smem_bytes, stream, args, dependent_launch);
  if (combine != nullptr) {
    launch_kernel(combine, {combine_grid, 1, 1}, row_threads, 0, stream, args, dependent_launch);
  }
}

void launch_prepared_kvcache(const PreparedKvCache& prepared, const KvCacheCall& call, CUstream stream, int device) {
  if (prepared.workspace_bytes == 0) {
    prepared(stream, 0);
    return;
  }
  if (call.workspace != 0) {
    check_device_pointer(reinterpret_cast<const void*>(call.workspace), "workspace", device);
    FLASHGEN_REQUIRE(call.workspace_bytes >= prepared.workspace_bytes,
                     "workspace: " + std::to_string(call.workspace_bytes) + " bytes given, " +
                         std::to_string(prepared.workspace_bytes) + " needed for " + std::to_string(prepared.splits) +
                         " key ranges (flashgen_attention_kvcache_workspace_size)");
    prepared(stream, call.workspace);
    return;
  }
  StreamAllocation owned(prepared.workspace_bytes, stream);
  prepared(stream, owned.ptr());
  owned.release();
}

}  // namespace flashgen
