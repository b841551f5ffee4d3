// What a tune or a compile phase runs: the problem `flashgen tune` flags describe, the problems of a JSON spec (every
// error naming the file and the field), the shard of them a task takes (--shard, Slurm's or Open MPI's variables) and a
// user variant attached to them.
#include "cli/tune.hpp"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cli/common.hpp"
#include "cli/run.hpp"
#include "cli/user_variant.hpp"
#include "flashgen/error.hpp"
#include "tuner/heuristic.hpp"

namespace flashgen::cli {

namespace {

// Whether a problem asks for the deterministic dQ strategy of a forward pass (which has none).
bool deterministic_forward(const AttentionProblem& p) {
  return p.pass == Pass::kForward && p.dq == DqStrategy::kDeterministic;
}

// A problem's dtype by name: fp16 or bf16, or e4m3 or e5m2 (the FP8 forward's q, k and v; its tiles are timed writing
// bf16 and serve fp16 alike, so the problem's output is bf16).
void set_dtype(AttentionProblem& p, const std::string& name) {
  p.dtype = name == "fp16"   ? DType::kFloat16
            : name == "bf16" ? DType::kBFloat16
            : name == "e4m3" ? DType::kFloat8E4M3
                             : DType::kFloat8E5M2;
  p.out_dtype = is_fp8(p.dtype) ? std::optional<DType>(DType::kBFloat16) : std::nullopt;
}

// Why the library refuses the problem (its sizes, as `run` checks them) or no kernel family takes its
// head_dims (checked against the sm80 family, which every supported GPU runs, then the Hopper families, which take
// wider ones), or nullopt: a sweep would stop at such a problem, so the dry run says it too.
std::optional<std::string> untunable(const AttentionProblem& p) {
  if (is_fp8(p.dtype) && (p.backward() || p.varlen || p.kv_cache)) {
    return std::string("dtype ") + dtype_name(p.dtype) + " is the FP8 forward's, of dense batches: not with " +
           (p.backward() ? "the backward" : p.varlen ? "a packed batch" : "a KV cache (an FP8 cache is cache_dtype)");
  }
  RunOptions as_run;
  as_run.problem = p;
  if (p.varlen && p.paged) as_run.prefill_page_size = p.page_size;  // run's packed call over a block table
  auto family_takes = [&p](int arch) {
    if (p.kv_cache) {
      // check_run_problem checks the KV-cache call's arguments, page_size among them.
    } else if (p.backward()) {
      heuristic_backward_configs(p.dtype, p.head_dim(), p.mask_kind(), p.deterministic(), arch, p.value_dim());
    } else {
      heuristic_forward_configs(p.dtype, p.head_dim(), p.mask_kind(), arch, false, p.value_dim());
    }
  };
  try {
    try {
      family_takes(80);
    } catch (const Error&) {
      family_takes(90);  // its message is the one reported when neither takes the problem
    }
    check_run_problem(as_run);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace

AttentionProblem problem_from_flags(const Args& args) {
  constexpr long long kIntMax = std::numeric_limits<int>::max();
  AttentionProblem problem;
  problem.pass = args.has("backward") ? Pass::kBackward : Pass::kForward;
  problem.dq = args.has("deterministic") ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
  if (deterministic_forward(problem)) fail(Status::kInvalidArgument, "--deterministic needs --backward");
  set_dtype(problem, args.choice_or("dtype", "fp16", {"fp16", "bf16", "e4m3", "e5m2"}));
  mask_from_flags(args, problem);
  problem.softcap = static_cast<float>(args.double_or("softcap", 0.0));
  problem.alibi = args.has("alibi");
  AttentionShape& s = problem.shape;
  s.head_dim = args.int_or("head-dim", 128, 1, 4096);
  s.head_dim_v = args.int_or("head-dim-v", s.head_dim, 1, 4096);
  if (s.head_dim_v == s.head_dim) s.head_dim_v = 0;
  s.batch = args.int_or("batch", 4, 1, kIntMax);
  s.heads_q = args.int_or("heads-q", 16, 1, kIntMax);
  s.heads_kv = args.int_or("heads-kv", 16, 1, kIntMax);
  problem.kv_cache = args.has("kv-cache");
  s.seqlen_q = args.int_or("seqlen-q", problem.kv_cache ? 1 : 4096, 1, kIntMax);
  s.seqlen_k = args.int_or("seqlen-k", 4096, 1, kIntMax);
  if (s.heads_q % s.heads_kv != 0) fail(Status::kInvalidArgument, "--heads-q must be a multiple of --heads-kv");
  packed_from_flags(args, problem);
  if (args.has("page-size") && !problem.kv_cache && !(problem.varlen && !problem.backward())) {
    fail(Status::kInvalidArgument, "--page-size needs --kv-cache, or --varlen without --backward (a packed backward "
                                   "has no paged kernels)");
  }
  if (problem.kv_cache && problem.backward()) fail(Status::kInvalidArgument, "--kv-cache tunes a forward: no --backward");
  cache_dtype_from_flags(args, problem);
  problem.page_size = static_cast<int>(args.int_or("page-size", 0, 0, 1 << 30));
  problem.paged = problem.page_size > 0;
  if (problem.varlen && problem.page_size % 16 != 0) {
    fail(Status::kInvalidArgument, "--page-size must be a multiple of 16 (pages are copied in 16-row boxes), got " +
                                       std::to_string(problem.page_size));
  }
  if (auto why = untunable(problem)) fail(Status::kInvalidArgument, *why);
  return problem;
}

TuneSpec read_tune_spec(const std::string& path, const AttentionProblem& defaults) {
  const Json j = read_json_file(path);
  auto bad = [&](const std::string& what) { fail(Status::kInvalidArgument, "tune spec " + path + ": " + what); };
  if (!j.is_object()) bad("must be a JSON object with a \"problems\" array");
  for (const auto& [key, value] : j.items())
    if (key != "problems" && key != "max_candidates") bad("unknown field \"" + key + "\"");
  TuneSpec spec;
  if (j.contains("max_candidates")) {
    if (!j["max_candidates"].is_number_integer() || j["max_candidates"].get<long long>() < 1)
      bad("\"max_candidates\" must be a positive integer");
    spec.max_candidates = j["max_candidates"].get<size_t>();
  }
  if (!j.contains("problems") || !j["problems"].is_array() || j["problems"].empty())
    bad("\"problems\" must be a non-empty array");
  for (size_t i = 0; i < j["problems"].size(); ++i) {
    const Json& entry = j["problems"][i];
    const std::string where = "problems[" + std::to_string(i) + "]";
    if (!entry.is_object()) bad(where + " must be an object");
    AttentionProblem p = defaults;
    std::optional<int64_t> total_q, total_k;  // a packed problem's own; else the default spread of its sizes
    // The entry's mask and window, applied once every field is read (the window's right side depends on
    // "causal"): the defaults' unless the entry names them.
    Mask causal = defaults.windowed() ? (defaults.window_right == 0 ? Mask::kCausal : Mask::kNone)
                                               : defaults.mask;
    std::optional<std::pair<int, int>> window;
    if (defaults.windowed() && !(defaults.attention_chunk > 0 && defaults.window_left == -1 && defaults.window_right <= 0)) {
      window = {defaults.window_left, defaults.window_right};  // a window of its own, not a chunk's mask
    }
    int chunk = defaults.attention_chunk;
    for (const auto& [key, value] : entry.items()) {
      auto positive = [&](int64_t& field) {
        if (!value.is_number_integer() || value.get<long long>() < 1 || value.get<long long>() > std::numeric_limits<int>::max())
          bad(where + "." + key + " must be a positive integer");
        field = value.get<int64_t>();
      };
      if (key == "pass") {
        if (value != "forward" && value != "backward") bad(where + ".pass must be \"forward\" or \"backward\"");
        p.pass = value == "backward" ? Pass::kBackward : Pass::kForward;
      } else if (key == "deterministic") {
        if (!value.is_boolean()) bad(where + ".deterministic must be true or false");
        p.dq = value.get<bool>() ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
      } else if (key == "dtype") {
        if (value != "fp16" && value != "bf16" && value != "e4m3" && value != "e5m2")
          bad(where + ".dtype must be \"fp16\", \"bf16\", \"e4m3\" or \"e5m2\"");
        set_dtype(p, value.get<std::string>());
      } else if (key == "causal") {
        if (value != "none" && value != "bottom-right" && value != "top-left")
          bad(where + ".causal must be \"none\", \"bottom-right\" or \"top-left\"");
        causal = mask_from_text(value.get<std::string>());
      } else if (key == "window") {
        auto side = [](const Json& v) { return v.is_number_integer() && v.get<long long>() >= -1 && v.get<long long>() <= INT32_MAX; };
        if (!value.is_array() || value.size() != 2 || !side(value[0]) || !side(value[1]))
          bad(where + ".window must be [left, right]: keys before and after the diagonal, each >= 0 or -1 for no bound");
        window = {value[0].get<int>(), value[1].get<int>()};
      } else if (key == "chunk") {
        if (!value.is_number_integer() || value.get<long long>() < 0 || value.get<long long>() > INT32_MAX)
          bad(where + ".chunk must be an integer >= 0: keys per chunk (Llama 4's attention_chunk; 0: none)");
        chunk = value.get<int>();
      } else if (key == "softcap") {
        if (!value.is_number() || !(value.get<double>() >= 0.0) || !std::isfinite(value.get<double>()))
          bad(where + ".softcap must be a number >= 0 (0: none)");
        p.softcap = value.get<float>();
      } else if (key == "alibi") {
        if (!value.is_boolean()) bad(where + ".alibi must be true or false");
        p.alibi = value.get<bool>();
      } else if (key == "head_dim") {
        positive(p.shape.head_dim);
      } else if (key == "head_dim_v") {
        positive(p.shape.head_dim_v);
      } else if (key == "batch") {
        positive(p.shape.batch);
      } else if (key == "heads_q") {
        positive(p.shape.heads_q);
      } else if (key == "heads_kv") {
        positive(p.shape.heads_kv);
      } else if (key == "seqlen_q") {
        positive(p.shape.seqlen_q);
      } else if (key == "seqlen_k") {
        positive(p.shape.seqlen_k);
      } else if (key == "varlen") {
        if (!value.is_boolean()) bad(where + ".varlen must be true or false");
        p.varlen = value.get<bool>();
      } else if (key == "total_q" || key == "total_k") {
        int64_t total = 0;
        positive(total);
        (key == "total_q" ? total_q : total_k) = total;
      } else if (key == "kv_cache") {
        if (!value.is_boolean()) bad(where + ".kv_cache must be true or false");
        p.kv_cache = value.get<bool>();
      } else if (key == "cache_dtype") {
        if (!value.is_string()) bad(where + ".cache_dtype must be \"e4m3\" or \"e5m2\"");
        try {
          p.cache_dtype = parse_cache_dtype(value.get<std::string>(), where + ".cache_dtype");
        } catch (const Error& e) {
          bad(e.what());
        }
      } else if (key == "page_size") {
        if (!value.is_number_integer() || value.get<long long>() < 0 || value.get<long long>() > (1 << 30))
          bad(where + ".page_size must be an integer in [0, 2^30] (0: a contiguous cache)");
        p.page_size = value.get<int>();
      } else {
        bad(where + ": unknown field \"" + key + "\"");
      }
    }
    if ((window || chunk > 0) && causal == Mask::kCausalTopLeft) {
      bad(where + (window ? ".window" : ".chunk") + " is aligned bottom-right (FlashAttention's window_size, Llama 4's "
                  "attention_chunk): it takes \"causal\": \"bottom-right\" or \"none\", not \"top-left\"");
    } else if (!window) {
      p.set_mask(causal, -1, -1, chunk);
    } else {  // FlashAttention's causal window: the right side 0
      p.set_mask(Mask::kSlidingWindow, window->first, causal == Mask::kCausal ? 0 : window->second,
                 chunk);
    }
    if (p.shape.head_dim_v == p.shape.head_dim) p.shape.head_dim_v = 0;
    if (p.shape.heads_q % p.shape.heads_kv != 0) bad(where + ": heads_q must be a multiple of heads_kv");
    if (deterministic_forward(p)) bad(where + ": deterministic needs \"pass\": \"backward\"");
    if (p.kv_cache && p.backward()) bad(where + ": kv_cache tunes a forward, not \"pass\": \"backward\"");
    if (p.page_size > 0 && !p.kv_cache && !(p.varlen && !p.backward()))
      bad(where + ": page_size needs \"kv_cache\": true, or \"varlen\": true with the forward pass");
    if ((entry.contains("total_q") || entry.contains("total_k")) && !p.varlen)
      bad(where + ": total_q and total_k need \"varlen\": true");
    if (p.varlen && p.kv_cache) bad(where + ": varlen and kv_cache are different problems: pick one");
    if (p.cache_dtype && !p.kv_cache) bad(where + ": cache_dtype needs \"kv_cache\": true (an FP8 cache is a KV cache's)");
    if (p.varlen) {
      try {
        make_packed(p, total_q, total_k, where + ".total_q", where + ".total_k");
      } catch (const Error& e) {
        bad(e.what());
      }
    }
    p.paged = p.page_size > 0;
    if (p.varlen && p.page_size % 16 != 0)
      bad(where + ".page_size must be a multiple of 16 (pages are copied in 16-row boxes), got " +
          std::to_string(p.page_size));
    if (!entry.contains("seqlen_q") && p.kv_cache && !defaults.kv_cache) p.shape.seqlen_q = 1;
    if (auto why = untunable(p)) bad(where + ": " + *why);
    spec.problems.push_back(p);
  }
  return spec;
}

namespace {

// "i/N" with 0 <= i < N.
std::optional<Shard> parse_shard(const std::string& text) {
  int index = -1, count = 0;
  char slash = 0, extra = 0;
  if (std::sscanf(text.c_str(), "%d %c %d %c", &index, &slash, &count, &extra) != 3 || slash != '/' || count < 1 ||
      index < 0 || index >= count)
    return std::nullopt;
  return Shard{index, count, ""};
}

// A scheduler variable's integer value; nullopt when unset, an error naming it when it is not an integer.
std::optional<int> env_int(const char* name) {
  const std::optional<std::string> text = env(name);
  if (!text) return std::nullopt;
  int value = 0;
  char extra = 0;
  if (std::sscanf(text->c_str(), "%d %c", &value, &extra) != 1)
    fail(Status::kInvalidArgument, std::string(name) + "=" + *text + " is not an integer");
  return value;
}

// The shard of a Slurm task, or nullopt outside Slurm. A task of a job array is the array index's share
// (SLURM_ARRAY_TASK_ID counted from SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP, among
// SLURM_ARRAY_TASK_COUNT); a job step of several tasks splits its share by SLURM_PROCID among SLURM_NTASKS. A batch
// script sets SLURM_PROCID alone (rank 0 of a job whose task count it does not know): that adds no split.
std::optional<Shard> slurm_shard() {
  std::optional<Shard> rank;
  if (const std::optional<std::string> r = env("SLURM_PROCID"), n = env("SLURM_NTASKS"); r && n) {
    rank = parse_shard(*r + "/" + *n);
    if (!rank) fail(Status::kInvalidArgument, "SLURM_PROCID=" + *r + " and SLURM_NTASKS=" + *n +
                                                  " do not name a shard (need 0 <= rank < size)");
  }
  const std::optional<int> task = env_int("SLURM_ARRAY_TASK_ID");
  if (!task) {
    if (rank) rank->source = "SLURM_PROCID/SLURM_NTASKS";
    return rank;
  }
  const std::optional<int> count = env_int("SLURM_ARRAY_TASK_COUNT");
  const int first = env_int("SLURM_ARRAY_TASK_MIN").value_or(0), step = env_int("SLURM_ARRAY_TASK_STEP").value_or(1);
  const int offset = *task - first;
  if (!count || step < 1 || offset < 0 || offset % step != 0 || offset / step >= *count) {
    fail(Status::kInvalidArgument,
         "SLURM_ARRAY_TASK_ID=" + std::to_string(*task) + " is not one of SLURM_ARRAY_TASK_COUNT=" +
             (count ? std::to_string(*count) : "(unset)") + " indices from SLURM_ARRAY_TASK_MIN=" +
             std::to_string(first) + " in steps of " + std::to_string(step) +
             ": an array of a range (--array=0-7) takes its shards from the index; otherwise pass --shard I/N");
  }
  Shard shard{offset / step, *count, "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"};
  if (rank && rank->count > 1) {
    shard.index = shard.index * rank->count + rank->index;
    shard.count *= rank->count;
    shard.source += " and SLURM_PROCID/SLURM_NTASKS";
  }
  return shard;
}

}  // namespace

Shard shard_of(const Args& args) {
  if (args.has("shard")) {
    const std::string text = args.string_or("shard", "");
    std::optional<Shard> shard = parse_shard(text);
    if (!shard) throw UsageError("--shard must be I/N with 0 <= I < N, got '" + text + "'", args.usage());
    if (!args.has("spec")) throw UsageError("--shard splits the problems of a --spec file", args.usage());
    shard->source = "--shard";
    return *shard;
  }
  if (!args.has("spec")) return Shard{};
  if (std::optional<Shard> shard = slurm_shard()) return *shard;
  const std::optional<std::string> r = env("OMPI_COMM_WORLD_RANK"), n = env("OMPI_COMM_WORLD_SIZE");
  if (!r || !n) return Shard{};
  std::optional<Shard> shard = parse_shard(*r + "/" + *n);
  if (!shard) fail(Status::kInvalidArgument, "OMPI_COMM_WORLD_RANK=" + *r + " and OMPI_COMM_WORLD_SIZE=" + *n +
                                                 " do not name a shard (need 0 <= rank < size)");
  shard->source = "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE";
  return *shard;
}

void attach_variant_to(std::vector<AttentionProblem>& problems, const std::shared_ptr<const UserVariant>& user,
                       const Args& args) {
  if (!user) return;
  for (AttentionProblem& p : problems) {
    if (p.varlen || p.kv_cache) {
      throw UsageError("--variant tunes dense problems, not the " + problem_line(p), args.usage());
    }
    if (user->modifies_scores() && (p.softcapped() || p.alibi)) {
      throw UsageError("--variant " + user->tag + " modifies the scores: its function takes the place of --softcap "
                       "and --alibi (write them into it)",
                       args.usage());
    }
    if (p.backward() && !user->has_gradient()) {
      throw UsageError("--variant " + user->tag + " has a score_mod but no score_grad: its backward cannot be tuned",
                       args.usage());
    }
    p.user = user;
  }
}

}  // namespace flashgen::cli
