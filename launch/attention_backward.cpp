// Backward launcher: validates tensor views and options into AttnBwdParams (no GPU needed); for a config it
// is given, checks the pointers against the launch context and what the kernel family can implement,
// binds the workspace and launches the module's kernels in order on the caller's stream. Bad input is
// reported before anything is launched.
#include "launch/attention_backward.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "launch/tensor_checks.hpp"
#include "launch/tma.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/stream_memory.hpp"

namespace flashgen {

namespace {

// Encodes the TMA maps of a backward call's tensors into params.
void encode_tma_maps(const BwdTmaTensors& t, AttnBwdSm90Params& params) {
  encode_tma_map(&params.q_map, t.q, t.q_rows);
  encode_tma_map(&params.do_map, t.dout, t.q_rows);
  encode_tma_map(&params.k_map, t.k, t.kv_rows);
  encode_tma_map(&params.v_map, t.v, t.kv_rows);
  encode_tma_map(&params.dk_map, t.dk, BwdTmaTensors::kGradRows);
  encode_tma_map(&params.dv_map, t.dv, BwdTmaTensors::kGradRows);
}

unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

// An FP8 call's q, k and v as BwdWiden's sources, with their descales; q, k and v keep the sources' pointers until
// the workspace is bound (bind_workspace) but take the strides of the 16-bit copies there (BSHD contiguous).
void widen_from(const TensorView* q, const TensorView* k, const TensorView* v, const CallOptions& opts,
                AttnBwdParams& p) {
  p.fp8_format = q->dtype == DType::kFloat8E4M3 ? 1 : 2;
  const TensorView* sources[3] = {q, k, v};
  for (int i = 0; i < 3; ++i) {
    p.fp8_sources[i] = sources[i]->data;
    for (int d = 0; d < 3; ++d) p.fp8_strides[i][d] = sources[i]->stride[d];
  }
  bind_fp8_descales(opts, p);
  auto contiguous = [](const TensorView* t, long long& batch, long long& row, long long& head) {
    head = t->shape[3], row = t->shape[2] * head, batch = t->shape[1] * row;
  };
  contiguous(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  contiguous(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  contiguous(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
}

}  // namespace

BackwardCall make_backward_call(const TensorView* q, const TensorView* k, const TensorView* v, const TensorView* out,
                                const TensorView* dout, const float* lse, const TensorView* dq, const TensorView* dk,
                                const TensorView* dv, const CallOptions* opts) {
  const std::pair<const TensorView*, const char*> tensors[] = {
      {q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {dout, "dout"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}};
  // FP8 q, k and v (one format, with descales) beside a 16-bit out, dout and gradients, all of one type.
  for (const auto& [t, name] : tensors) check_tensor(t, name, /*fp8_taken=*/t == q || t == k || t == v);
  FLASHGEN_REQUIRE(lse != nullptr, "lse: null pointer (pass what flashgen_attention_forward wrote)");
  FLASHGEN_REQUIRE(opts != nullptr, "opts: null pointer");
  const bool fp8 = is_fp8(q->dtype);
  for (const auto& [t, name] : tensors) {
    if (t == q) continue;
    if (!fp8 || t == k || t == v) {
      require_same_dtype(t, name, q);
    } else if (t != out) {
      FLASHGEN_REQUIRE(t->dtype == out->dtype, std::string(name) + ".dtype is " + dtype_name(t->dtype) +
                                                   " but out.dtype is " + dtype_name(out->dtype) +
                                                   " (an FP8 call's dout and gradients are of its output's type)");
    }
  }
  check_fp8_descales(*opts, fp8, "16-bit q, k and v (descales are an FP8 call's)");
  require_same_dim(k, "k", q, "q", 0);
  require_same_dim(k, "k", q, "q", 3);
  check_value_dim(v, "v", out, "out", q, /*own_dim_taken=*/true);
  for (int i = 0; i < 4; ++i) {
    if (i < 3) require_same_dim(v, "v", k, "k", i);
    if (i < 3) require_same_dim(out, "out", q, "q", i);
    require_same_dim(dout, "dout", out, "out", i);
    require_same_dim(dq, "dq", q, "q", i);
    require_same_dim(dk, "dk", k, "k", i);
    require_same_dim(dv, "dv", v, "v", i);
  }
  check_head_dim_and_groups(q, k, /*max_head_dim=*/512);
  if (fp8 && (q->shape[3] % 16 != 0 || q->shape[3] > 256 || v->shape[3] != q->shape[3])) {
    fail(Status::kUnsupported, "q.shape[3] (head_dim) is " + std::to_string(q->shape[3]) + " and v.shape[3] " +
                                   std::to_string(v->shape[3]) +
                                   ": the FP8 backward takes one head dim, a multiple of 16 up to 256");
  }
  // The widening kernel's grid takes q, k and v of every batch entry along z (BwdWiden).
  FLASHGEN_REQUIRE(!fp8 || 3 * q->shape[0] <= 65535, "q.shape[0] (batch) is " + std::to_string(q->shape[0]) +
                                                         ": an FP8 backward takes at most 21845 (grid limits)");
  for (const auto& [t, name] : tensors) check_layout(t, name);
  check_output_strides(dq, "dq");
  check_output_strides(dk, "dk");
  check_output_strides(dv, "dv");
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(lse) % alignof(float) == 0, "lse: pointer must be 4-byte aligned");
  check_options(opts, q->shape[2]);
  FLASHGEN_REQUIRE(q->shape[0] <= 32767 && q->shape[2] <= 65535,
                   "q: batch must be at most 32767 and heads at most 65535 (grid limits)");

  BackwardCall call;
  // An FP8 call runs the 16-bit backward of its output's type over q, k and v widened into the workspace.
  call.problem =
      backward_problem(fp8 ? out->dtype : q->dtype, shape_of(q, k, v), opts->mask, opts->deterministic,
                       opts->window_left, opts->window_right, opts->attention_chunk);
  call.problem.softcap = opts->softcap;
  call.problem.alibi = opts->alibi_slopes != nullptr;

  AttnBwdParams& p = call.params;
  p.q = q->data, p.k = k->data, p.v = v->data, p.o = out->data, p.dout = dout->data;
  p.lse = const_cast<float*>(lse);  // the forward's output, which the backward only reads
  p.dq = dq->data, p.dk = dk->data, p.dv = dv->data;
  auto strides = [](const TensorView* t, long long& batch, long long& row, long long& head) {
    batch = t->stride[0], row = t->stride[1], head = t->stride[2];
  };
  strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides(out, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  strides(dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  strides(dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  strides(dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  strides(dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.batch = static_cast<int>(q->shape[0]);
  p.seqlen_q = static_cast<int>(q->shape[1]);
  p.heads_q = static_cast<int>(q->shape[2]);
  p.seqlen_k = static_cast<int>(k->shape[1]);
  p.heads_kv = static_cast<int>(k->shape[2]);
  p.group_size = p.heads_q / p.heads_kv;
  set_user_variant(call.problem, *opts);
  p.variant = variant_args(call.problem, *opts, p.seqlen_q, p.seqlen_k);
  call.block_mask = user_block_mask(*opts, call.problem);
  FLASHGEN_REQUIRE(opts->dsinks == nullptr || opts->sinks != nullptr,
                   "opts.dsinks: given without opts.sinks (there is no sink to take a gradient)");
  p.dsinks = opts->dsinks;
  call.problem.sink_grad = opts->dsinks != nullptr;
  if (fp8) widen_from(q, k, v, *opts, p);
  return call;
}

BackwardCall make_varlen_backward_call(const VarlenBackwardArgs& args) {
  if (is_fp8(args.q.dtype)) {
    fail(Status::kUnsupported, std::string("q.dtype is ") + dtype_name(args.q.dtype) +
                                   ": the FP8 backward takes dense batches (flashgen_attention_backward), not packed "
                                   "ones");
  }
  BackwardCall call = make_backward_call(&args.q, &args.k, &args.v, &args.out, &args.dout, args.lse, &args.dq, &args.dk,
                                         &args.dv, &args.options);
  const Packing packing{args.cu_seqlens_q, args.cu_seqlens_k, nullptr,
                        args.batch,        args.max_seqlen_q, args.max_seqlen_k};
  check_packing(args.q, args.k, packing);
  AttnBwdParams& p = call.params;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;  // every sequence in entry 0
  p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = 0;
  bind_packing(packing, args.q, args.k, call.problem, p);
  return call;
}

namespace {

// A user mask's block classes of a dense call at the dkdv kernel's tiles, per kv head (or once per batch entry when
// every head shares the mask), without their kernels; empty for other calls.
UserBlockLaunch plan_user_blocks(const AttnBwdParams& p, const BwdConfig& config) {
  if (!has_user_block_classes(config)) return {};
  return UserBlockLaunch::plan(config.block_m, config.block_n, (p.seqlen_q + config.block_m - 1) / config.block_m,
                               (p.seqlen_k + config.block_n - 1) / config.block_n,
                               config.user->mask_same_for_heads ? 1 : p.heads_kv,
                               config.user->mask_same_for_heads ? 1 : p.group_size, p.batch, true);
}

}  // namespace

size_t backward_workspace_bytes(const BackwardCall& call, const BwdConfig& config) {
  const UserBlockLaunch classes = plan_user_blocks(call.params, config);
  return config.workspace(call.params, classes && call.block_mask == nullptr ? classes.bytes() : 0).bytes;
}

namespace {

void check_device_pointers(const AttnBwdParams& p, int device) {
  const std::pair<const void*, const char*> pointers[] = {
      {p.q, "q.data"},       {p.k, "k.data"},     {p.v, "v.data"},   {p.o, "out.data"}, {p.dout, "dout.data"},
      {p.lse, "lse"},        {p.dq, "dq.data"},   {p.dk, "dk.data"}, {p.dv, "dv.data"}};
  for (const auto& [ptr, name] : pointers) check_device_pointer(ptr, name, device);
  if (p.cu_seqlens_q != nullptr) {
    check_device_pointer(p.cu_seqlens_q, "cu_seqlens_q", device);
    check_device_pointer(p.cu_seqlens_k, "cu_seqlens_k", device);
  }
  if (p.variant.alibi_slopes != nullptr) check_device_pointer(p.variant.alibi_slopes, "opts.alibi_slopes", device);
  check_fp8_descale_pointers(p, device);
  if (p.variant.sinks != nullptr) check_device_pointer(p.variant.sinks, "opts.sinks", device);
  check_user_buffers(p.variant, device);
  if (p.dsinks != nullptr) check_device_pointer(p.dsinks, "opts.dsinks", device);
}

}  // namespace

PreparedBackward prepare_backward(const BackwardCall& call, CUstream stream, const BwdConfig& requested) {
  const AttnBwdParams& p = call.params;
  // An FP8 call runs the chosen 16-bit config's _fp8in twin (the widening kernel first); a 16-bit call none.
  FLASHGEN_REQUIRE(!requested.fp8_inputs || p.fp8_format != 0,
                   "config " + requested.name() + " widens FP8 inputs, but q.dtype is " + dtype_name(call.problem.dtype));
  BwdConfig c = requested;
  c.fp8_inputs = p.fp8_format != 0;
  const ScopedContext scope(stream, p.q);
  check_device_pointers(p, scope.device());
  const int arch = launch_arch(scope.device());
  if (p.fp8_format != 0 && arch < 89) {
    fail(Status::kUnsupported, "q.dtype is " + std::string(p.fp8_format == 1 ? "e4m3" : "e5m2") +
                                   ": FP8 needs sm_89 or newer (its conversions); this GPU is sm_" +
                                   std::to_string(arch));
  }
  if (const Implementability answer = c.can_implement(call.problem, p, device_traits(scope.device())); !answer) {
    fail_unimplementable(c.name(), answer);
  }
  // The sm80 family's head_dim slices and its dq kernel's column slices take blocks of their own along the grid's z,
  // beside the batch; the sm90 family keeps the whole head_dim.
  const BwdSm80Knobs* sm80 = c.sm80();
  const int dkdv_slices = sm80 ? sm80->d_split : 1;
  const int dq_slices = c.has_dq_kernel() ? c.dq_traits().slices : 1;
  const int slices = std::max(dkdv_slices, dq_slices);
  FLASHGEN_REQUIRE(static_cast<long long>(p.batch) * slices <= 65535,
                   "batch is " + std::to_string(p.batch) + " but config " + c.name() + " gives each batch entry " +
                       std::to_string(slices) + " column slices of blocks (grid limit 65535): at most " +
                       std::to_string(65535 / slices));

  // The kernels of a _dsink module read the sinks and write partials only the sinks' gradient kernel reads.
  FLASHGEN_REQUIRE(!c.sink_grad || p.dsinks != nullptr,
                   "config " + c.name() + " sums the sinks' gradient: the call must have sinks and opts.dsinks");
  PreparedBackward prepared;
  prepared.config = c;
  prepared.arch = arch;
  if (c.family() == KernelFamily::kSm90) {
    prepared.uses_tma = true;
    const BwdTmaTensors tensors(call.problem, p, c);
    encode_tma_maps(tensors, prepared.sm90_params);
    if (p.fp8_format != 0) prepared.widened_tma = tensors;  // q, k and v re-pointed at the workspace's copies
  }
  KernelRegistry& registry = KernelRegistry::instance();
  prepared.preprocess = registry.function(c, BwdKernel::kPreprocess, scope.context(), arch);
  prepared.dkdv = registry.function(c, BwdKernel::kDkdv, scope.context(), arch);
  const BwdKernel finish = c.has_dq_kernel() ? BwdKernel::kDq : BwdKernel::kConvert;
  prepared.finish = registry.function(c, finish, scope.context(), arch);
  prepared.sink_grad = registry.function(c, BwdKernel::kSinkGrad, scope.context(), arch);
  if (p.fp8_format != 0) {
    prepared.widen = registry.function(c, BwdKernel::kWiden, scope.context(), arch);
    const long long rows = std::max(p.seqlen_q, p.seqlen_k);
    prepared.widen_grid[0] = ceil_div(rows * (std::max(c.head_dim, c.value_dim()) / 8), kBwdRowKernelThreads);
    prepared.widen_grid[1] = static_cast<unsigned>(std::max(p.heads_q, p.heads_kv));
    prepared.widen_grid[2] = static_cast<unsigned>(3 * p.batch);
  }

  const int rows_per_block = bwd_preprocess_rows_per_block(call.problem.value_dim());
  prepared.preprocess_grid[0] = ceil_div(static_cast<long long>(c.workspace_rows(p)), rows_per_block);
  prepared.preprocess_grid[1] = static_cast<unsigned>(p.heads_q);
  prepared.preprocess_grid[2] = static_cast<unsigned>(p.batch);
  prepared.dkdv_grid[0] = ceil_div(p.seqlen_k, c.block_n);
  prepared.dkdv_grid[1] = static_cast<unsigned>(p.heads_kv);
  prepared.dkdv_grid[2] = static_cast<unsigned>(p.batch * dkdv_slices);
  prepared.dkdv_threads = static_cast<unsigned>(c.threads(BwdKernel::kDkdv));
  prepared.dkdv_smem = static_cast<unsigned>(c.smem_bytes(BwdKernel::kDkdv));
  if (c.has_dq_kernel()) {
    const BwdDqTraits dq = c.dq_traits();
    prepared.finish_grid[0] = ceil_div(p.seqlen_q, c.dq_block_m);
    prepared.finish_threads = static_cast<unsigned>(dq.threads);
    prepared.finish_smem = static_cast<unsigned>(dq.smem_bytes);
  } else if (c.dq_accum() == DqAccum::kTiles) {  // a block per 64 x 64 chunk of each 64-row tile (bwd_rows.cuh)
    const int chunks = dq_accum_cols(DqAccum::kTiles, call.problem.head_dim()) / 64;
    prepared.finish_grid[0] = ceil_div(p.seqlen_q, 64) * static_cast<unsigned>(chunks);
    prepared.finish_threads = kBwdRowKernelThreads;
    prepared.finish_overlaps_dkdv = dq_adds_counted(DqAccum::kTiles, c.head_dim, c.block_m, c.block_n, c.stages,
                                                     c.value_dim());
  } else {
    prepared.finish_grid[0] = ceil_div(static_cast<long long>(p.seqlen_q) * (call.problem.head_dim() / 8), kBwdRowKernelThreads);
    prepared.finish_threads = kBwdRowKernelThreads;
  }
  prepared.sink_grad_grid[0] = static_cast<unsigned>(p.heads_q);  // a block per query head (bwd_rows.cuh)
  prepared.finish_grid[1] = static_cast<unsigned>(p.heads_q);
  prepared.finish_grid[2] = static_cast<unsigned>(p.batch * dq_slices);
  if ((prepared.user_blocks = plan_user_blocks(p, c))) {
    prepared.user_blocks.tiles = registry.function(c, BwdKernel::kUserBlockTiles, scope.context(), arch);
    prepared.user_blocks.ranges = registry.function(c, BwdKernel::kUserBlockRanges, scope.context(), arch);
    prepared.user_blocks.bands = registry.function(c, BwdKernel::kUserBlockBands, scope.context(), arch);
  }
  prepared.workspace_bytes = backward_workspace_bytes(call, c);
  prepared.params = p;
  prepared.block_mask = call.block_mask;
  return prepared;
}

void PreparedBackward::rebind(const BackwardCall& call, int device) {
  check_device_pointers(call.params, device);
  params = call.params;  // the workspace pointers are bound at launch
  block_mask = call.block_mask;
  if (!uses_tma) return;
  if (!tma_maps_retargetable()) {
    encode_tma_maps(BwdTmaTensors(call.problem, call.params, config), sm90_params);
    return;
  }
  const AttnBwdParams& p = call.params;
  retarget_tma_map(&sm90_params.q_map, p.q);
  retarget_tma_map(&sm90_params.do_map, p.dout);
  retarget_tma_map(&sm90_params.k_map, p.k);
  retarget_tma_map(&sm90_params.v_map, p.v);
  retarget_tma_map(&sm90_params.dk_map, p.dk);
  retarget_tma_map(&sm90_params.dv_map, p.dv);
}

void PreparedBackward::bind_workspace(CUdeviceptr workspace) {
  const BwdWorkspace layout = config.workspace(params, user_blocks && block_mask == nullptr ? user_blocks.bytes() : 0);
  params.dsum = reinterpret_cast<float*>(workspace_part(workspace, layout.dsum));
  params.lse_log2 = reinterpret_cast<float*>(workspace_part(workspace, layout.lse_log2));
  params.dq_accum = reinterpret_cast<float*>(workspace_part(workspace, layout.dq_accum));
  params.dq_semaphore = reinterpret_cast<int*>(workspace_part(workspace, layout.dq_semaphore));
  if (layout.user_classes != Workspace::kAbsent) params.user_classes = user_blocks.at(workspace + layout.user_classes);
  if (params.fp8_format != 0) {  // the 16-bit copies BwdWiden writes
    params.q = reinterpret_cast<void*>(workspace_part(workspace, layout.widened[0]));
    params.k = reinterpret_cast<void*>(workspace_part(workspace, layout.widened[1]));
    params.v = reinterpret_cast<void*>(workspace_part(workspace, layout.widened[2]));
    if (uses_tma && tma_maps_retargetable()) {
      retarget_tma_map(&sm90_params.q_map, params.q);
      retarget_tma_map(&sm90_params.k_map, params.k);
      retarget_tma_map(&sm90_params.v_map, params.v);
    } else if (uses_tma) {
      BwdTmaTensors tensors = *widened_tma;
      tensors.q.data = params.q, tensors.k.data = params.k, tensors.v.data = params.v;
      encode_tma_map(&sm90_params.q_map, tensors.q, tensors.q_rows);
      encode_tma_map(&sm90_params.k_map, tensors.k, tensors.kv_rows);
      encode_tma_map(&sm90_params.v_map, tensors.v, tensors.kv_rows);
    }
  }
  sm90_params.base = params;
}

void PreparedBackward::operator()(CUstream stream) const {
  if (user_blocks && block_mask != nullptr) {  // the classes kept across calls: computed by the first
    PreparedBackward with_classes = *this;
    with_classes.block_mask = nullptr;
    void* args[] = {&with_classes.params};
    user_blocks.launch_kept(*block_mask, block_mask_key(config.name(), params), with_classes.params.user_classes,
                            stream, args);
    with_classes.sm90_params.base = with_classes.params;
    with_classes.user_blocks = {};  // computed or kept: the copy launches the attention's kernels alone
    with_classes(stream);
    return;
  }
  void* args[] = {const_cast<AttnBwdParams*>(&params)};
  void* dkdv_args[] = {uses_tma ? static_cast<void*>(const_cast<AttnBwdSm90Params*>(&sm90_params))
                                : static_cast<void*>(const_cast<AttnBwdParams*>(&params))};
  if (user_blocks) user_blocks.launch(stream, args);  // read by the dkdv and convert kernels
  if (widen != nullptr) launch_kernel(widen, widen_grid, kBwdRowKernelThreads, 0, stream, args);
  launch_kernel(preprocess, preprocess_grid, kBwdRowKernelThreads, 0, stream, args);
  launch_kernel(dkdv, dkdv_grid, dkdv_threads, dkdv_smem, stream, dkdv_args);
  // Where the dkdv kernel counts each query block's dQ adds, the convert kernel runs on the SMs its last
  // blocks leave, waiting for each query block's adds (bwd_rows.cuh).
  launch_kernel(finish, finish_grid, finish_threads, finish_smem, stream, args, finish_overlaps_dkdv);
  if (params.dsinks != nullptr) launch_kernel(sink_grad, sink_grad_grid, kBwdRowKernelThreads, 0, stream, args);
}

void check_workspace_alignment(CUdeviceptr workspace) {
  FLASHGEN_REQUIRE(workspace % kBackwardWorkspaceAlignment == 0,
                   "workspace: pointer must be " + std::to_string(kBackwardWorkspaceAlignment) + "-byte aligned");
}

void launch_prepared_backward(PreparedBackward& prepared, CUstream stream, int device, CUdeviceptr workspace,
                              size_t workspace_bytes) {
  check_workspace_alignment(workspace);
  if (workspace != 0) {
    check_device_pointer(reinterpret_cast<const void*>(workspace), "workspace", device);
    FLASHGEN_REQUIRE(workspace_bytes >= prepared.workspace_bytes,
                     "workspace: " + std::to_string(workspace_bytes) + " bytes given, " +
                         std::to_string(prepared.workspace_bytes) + " needed by " + prepared.config.name());
    prepared.bind_workspace(workspace);
    prepared(stream);
    return;
  }
  StreamAllocation owned(prepared.workspace_bytes, stream);
  prepared.bind_workspace(owned.ptr());
  prepared(stream);
  owned.release();
}

void launch_backward(const BackwardCall& call, CUstream stream, const BwdConfig& config, CUdeviceptr workspace,
                     size_t workspace_bytes) {
  check_workspace_alignment(workspace);  // before anything needs a GPU
  const ScopedContext scope(stream, call.params.q);
  PreparedBackward prepared = prepare_backward(call, stream, config);
  launch_prepared_backward(prepared, stream, scope.device(), workspace, workspace_bytes);
}

}  // namespace flashgen
