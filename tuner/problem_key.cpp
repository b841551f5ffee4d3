// Device fingerprints and problem keys of the tuning store: their stable text ids, power-of-two size
// buckets and the bucket distance the run-time lookup uses to find the nearest stored problem.
#include "tuner/problem_key.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace flashgen {

namespace {

// A paged packed forward's pass id before its page size.
constexpr const char* kPagedPrefillPass = "fwd_varlen_paged";

// Exponent of a power-of-two bucket; a key whose bucket is not one was not built by size_bucket.
int bucket_exponent(int64_t bucket, const char* what) {
  FLASHGEN_REQUIRE(bucket >= 1 && (bucket & (bucket - 1)) == 0,
                   std::string("problem key ") + what + " bucket must be a power of two, got " +
                       std::to_string(bucket));
  int exponent = 0;
  while ((int64_t{1} << exponent) < bucket) ++exponent;
  return exponent;
}

// A window key's bucket and shape as ids and the mask column spell them: "1024", "1024c" when causal-shaped.
std::string window_text(const ProblemKey& key) {
  return std::to_string(key.window_bucket) + (key.window_causal ? "c" : "");
}

// A window problem's bucket and shape in its key.
void set_key_window(const AttentionProblem& problem, ProblemKey& key) {
  if (!problem.windowed()) return;
  key.window_bucket = size_bucket(window_span(problem));
  key.window_causal = problem.window_right == 0;
}

// Whether keys of mask carry a window bucket: a window's, a chunked window's.
bool keyed_by_window(MaskKind mask) { return mask == MaskKind::kWindow || mask == MaskKind::kChunk; }

}  // namespace

std::string DeviceFingerprint::id() const {
  return gpu_name + "|sm" + std::to_string(sm) + "|" + std::to_string(sm_count) + "sm|drv" +
         std::to_string(driver_version) + "|nvrtc" + nvrtc_version + "|gen" + generator_version;
}

DeviceFingerprint current_device_fingerprint(int device) {
  driver();  // throws Error(kNoDevice) naming the cause before any entry point is touched
  CUdevice handle = 0;
  FLASHGEN_CU_CHECK(cuDeviceGet(&handle, device));
  char name[256] = {};
  FLASHGEN_CU_CHECK(cuDeviceGetName(name, static_cast<int>(sizeof(name)), handle));
  DeviceFingerprint fp;
  fp.gpu_name = name;
  fp.sm = device_sm(handle);
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&fp.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, handle));
  FLASHGEN_CU_CHECK(cuDriverGetVersion(&fp.driver_version));
  fp.nvrtc_version = nvrtc_version();
  fp.generator_version = kGeneratorVersion;
  return fp;
}

DeviceFingerprint fingerprint_for_arch(int arch) {
  DeviceFingerprint fp;
  fp.gpu_name = "sm_" + std::to_string(arch) + " (no device)";
  fp.sm = arch;
  fp.nvrtc_version = nvrtc_version();
  fp.generator_version = kGeneratorVersion;
  return fp;
}

int64_t size_bucket(int64_t n) {
  FLASHGEN_REQUIRE(n >= 1, "size_bucket: size must be >= 1, got " + std::to_string(n));
  // 2^62 is the largest power of two an int64_t holds with room to compare against.
  FLASHGEN_REQUIRE(n <= (int64_t{1} << 62), "size_bucket: size " + std::to_string(n) + " is larger than 2^62");
  int64_t bucket = 1;
  while (bucket < n) bucket <<= 1;
  return bucket;
}

std::string ProblemKey::pass_id() const {
  if (kv_cache) {
    return std::string(paged ? "dec_paged" : "dec") + (cache_dtype ? std::string("_kv") + dtype_name(*cache_dtype) : "");
  }
  if (pass == Pass::kForward) {
    if (page_size > 0) return std::string(kPagedPrefillPass) + std::to_string(page_size);
    return varlen ? "fwd_varlen" : "fwd";
  }
  if (dq == DqStrategy::kDeterministic) return varlen ? "bwd_det_varlen" : "bwd_det";
  return varlen ? "bwd_varlen" : "bwd";
}

void read_pass_id(const std::string& text, ProblemKey& key) {
  key.kv_cache = false, key.paged = false, key.page_size = 0, key.cache_dtype.reset();
  const std::string paged_prefill = kPagedPrefillPass;
  if (text == "fwd" || text == "fwd_varlen") {
    key.pass = Pass::kForward, key.dq = DqStrategy::kAtomic, key.varlen = text == "fwd_varlen";
  } else if (text.compare(0, paged_prefill.size(), paged_prefill) == 0) {
    // The page size as pass_id spells it: a positive multiple of 16 up to 2^30 (the calls' bound), no leading zero.
    const std::string digits = text.substr(paged_prefill.size());
    const bool spelt = !digits.empty() && digits.size() <= 10 && digits[0] != '0' &&
                       digits.find_first_not_of("0123456789") == std::string::npos;
    const long long page_size = spelt ? std::stoll(digits) : 0;
    if (page_size <= 0 || page_size % 16 != 0 || page_size > (1LL << 30)) {
      fail(Status::kInvalidArgument, "problem pass '" + text + "': a paged packed forward's page size (" +
                                         paged_prefill + "N) must be a positive multiple of 16 up to 2^30");
    }
    key.pass = Pass::kForward, key.dq = DqStrategy::kAtomic, key.varlen = true;
    key.paged = true, key.page_size = static_cast<int>(page_size);
  } else if (text == "dec" || text == "dec_paged" || text.rfind("dec_kv", 0) == 0 || text.rfind("dec_paged_kv", 0) == 0) {
    key.pass = Pass::kForward, key.dq = DqStrategy::kAtomic, key.varlen = false;
    key.kv_cache = true, key.paged = text.rfind("dec_paged", 0) == 0;
    const size_t kv = text.find("_kv");
    if (kv != std::string::npos) key.cache_dtype = parse_cache_dtype(text.substr(kv + 3), "problem pass '" + text + "'");
  } else if (text == "bwd" || text == "bwd_det" || text == "bwd_varlen" || text == "bwd_det_varlen") {
    key.pass = Pass::kBackward;
    key.dq = text.rfind("bwd_det", 0) == 0 ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
    key.varlen = text.size() > 7 && text.compare(text.size() - 7, 7, "_varlen") == 0;
  } else {
    fail(Status::kInvalidArgument,
         "problem pass must be fwd, fwd_varlen, fwd_varlen_paged<page size>, bwd, bwd_det, bwd_varlen, bwd_det_varlen, "
         "dec or dec_paged (with _kve4m3 or _kve5m2 for an FP8 cache), got '" + text + "'");
  }
}

std::string variant_text(MaskKind mask, const ScoreMods& mods, const std::string& user_tag) {
  return std::string(mask_name(mask)) + score_mods_suffix(mods) + (user_tag.empty() ? "" : "_" + user_tag);
}

std::string mask_text(const ProblemKey& key) {
  if (!keyed_by_window(key.mask)) return variant_text(key.mask, key.mods, key.user_tag);
  return mask_name(key.mask) + window_text(key) + score_mods_suffix(key.mods) +
         (key.user_tag.empty() ? "" : "_" + key.user_tag);
}

namespace {

// A user variant's tag as names and ids spell it: "u" and 12 lowercase hex digits.
bool is_user_tag(const std::string& field) {
  return field.size() == 13 && field[0] == 'u' && field.find_first_not_of("0123456789abcdef", 1) == std::string::npos;
}

}  // namespace

void read_mask_text(const std::string& text, ProblemKey& key) {
  auto unknown = [&] { fail(Status::kInvalidArgument, "tuning data: unknown mask '" + text + "'"); };
  // The mask, then the modifiers' suffixes: "causal_softcap_alibi", "window1024c_alibi", "chunk8192c".
  const size_t first_underscore = text.find('_');
  std::string variant = text.substr(0, first_underscore);
  key.mods = {};
  key.user_tag.clear();
  if (first_underscore != std::string::npos) {
    std::istringstream fields(text.substr(first_underscore + 1));
    for (std::string field; std::getline(fields, field, '_');) {
      if (is_user_tag(field) && key.user_tag.empty() && !key.varlen && !key.kv_cache) {  // dense keys only
        key.user_tag = field;
      } else if (!key.user_tag.empty() || !read_score_mod_suffix(field, key.mods)) {
        unknown();  // the tag comes last
      }
    }
  }
  key.window_bucket = 0, key.window_causal = false;
  for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal}) {
    if (variant == mask_name(mask)) {
      key.mask = mask;
      if (mask_text(key) != text) unknown();  // the modifiers in their one order
      return;
    }
  }
  const std::string window = mask_name(MaskKind::kWindow), chunk = mask_name(MaskKind::kChunk);
  if (variant.compare(0, window.size(), window) == 0) {
    key.mask = MaskKind::kWindow;
    variant.erase(0, window.size());
  } else if (variant.compare(0, chunk.size(), chunk) == 0) {
    key.mask = MaskKind::kChunk;
    variant.erase(0, chunk.size());
  } else {
    unknown();
  }
  key.window_causal = !variant.empty() && variant.back() == 'c';
  if (key.window_causal) variant.pop_back();
  if (variant.empty() || variant.size() > 18 || variant.find_first_not_of("0123456789") != std::string::npos) unknown();
  key.window_bucket = std::stoll(variant);
  // Only size_bucket's values, spelt as mask_text spells them ("window01024" would be another key).
  if (key.window_bucket < 1 || size_bucket(key.window_bucket) != key.window_bucket || mask_text(key) != text) {
    unknown();
  }
}

std::string ProblemKey::class_id() const {
  const std::string value_dim_text = head_dim_v > 0 ? "v" + std::to_string(head_dim_v) : "";
  return pass_id() + "|" + dtype_name(dtype) + "|d" + std::to_string(head_dim) + value_dim_text + "|" +
         variant_text(mask, mods, user_tag) + "|g" + std::to_string(gqa_ratio);
}

std::string ProblemKey::id() const {
  return class_id() + "|q" + std::to_string(seqlen_q_bucket) + "|k" + std::to_string(seqlen_k_bucket) + "|bh" +
         std::to_string(batch_heads_bucket) + (keyed_by_window(mask) ? "|w" + window_text(*this) : "");
}

int64_t window_span(const AttentionProblem& problem) {
  const int64_t keys = problem.shape.seqlen_k;
  auto side = [&](int given) { return given < 0 ? keys : std::min<int64_t>(given, keys); };
  const int64_t span = std::min(side(problem.window_left) + side(problem.window_right) + 1, keys);
  return problem.attention_chunk > 0 ? std::min<int64_t>(span, problem.attention_chunk) : span;
}

ProblemKey forward_problem_key(DType dtype, int head_dim, MaskKind mask, int gqa_ratio, int64_t seqlen_q,
                               int64_t seqlen_k, int64_t batch_heads) {
  FLASHGEN_REQUIRE(gqa_ratio >= 1, "forward_problem_key: gqa_ratio must be >= 1, got " + std::to_string(gqa_ratio));
  ProblemKey key;
  key.dtype = dtype;
  key.head_dim = head_dim;
  key.mask = mask;
  key.gqa_ratio = gqa_ratio;
  key.seqlen_q_bucket = size_bucket(seqlen_q);
  key.seqlen_k_bucket = size_bucket(seqlen_k);
  key.batch_heads_bucket = size_bucket(batch_heads);
  return key;
}

ProblemKey backward_problem_key(DType dtype, int head_dim, MaskKind mask, bool deterministic, int gqa_ratio,
                                int64_t seqlen_q, int64_t seqlen_k, int64_t batch_heads) {
  ProblemKey key = forward_problem_key(dtype, head_dim, mask, gqa_ratio, seqlen_q, seqlen_k, batch_heads);
  key.pass = Pass::kBackward;
  key.dq = deterministic ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
  return key;
}

std::string user_key_tag(const AttentionProblem& problem) {
  return problem.user && !problem.varlen && !problem.kv_cache ? problem.user->tag : "";
}

ProblemKey problem_key(const AttentionProblem& problem) {
  const AttentionShape& s = problem.shape;
  const int group_size = static_cast<int>(s.group_size());
  const int head_dim_v = problem.value_dim() != problem.head_dim() ? problem.value_dim() : 0;
  if (problem.backward()) {
    ProblemKey key = backward_problem_key(problem.dtype, problem.head_dim(), problem.mask_kind(),
                                          problem.deterministic(), group_size, s.seqlen_q, s.seqlen_k,
                                          s.batch * s.heads_q);
    key.head_dim_v = head_dim_v;
    key.varlen = problem.varlen;
    key.mods = problem.score_mods();
    set_key_window(problem, key);
    key.user_tag = user_key_tag(problem);
    return key;
  }
  ProblemKey key = forward_problem_key(problem.dtype, problem.head_dim(), problem.mask_kind(), group_size, s.seqlen_q,
                                       s.seqlen_k, s.batch * s.heads_q);
  key.head_dim_v = head_dim_v;
  key.varlen = problem.varlen;
  key.mods = problem.score_mods();
  set_key_window(problem, key);
  key.kv_cache = problem.kv_cache;  // seqlen_q: the new tokens per sequence; seqlen_k: the cache's capacity
  key.cache_dtype = problem.kv_cache ? problem.cache_dtype : std::nullopt;
  key.paged = (problem.kv_cache || problem.varlen) && problem.paged;
  key.page_size = problem.varlen && problem.paged ? problem.page_size : 0;
  FLASHGEN_REQUIRE(!problem.varlen || !problem.paged || (problem.page_size > 0 && problem.page_size % 16 == 0),
                   "a packed problem over a paged cache needs its page_size, a positive multiple of 16, got " +
                       std::to_string(problem.page_size));
  key.user_tag = user_key_tag(problem);
  return key;
}

int bucket_distance(const ProblemKey& a, const ProblemKey& b) {
  FLASHGEN_REQUIRE(a.class_id() == b.class_id(),
                   "bucket_distance: keys of different classes: " + a.class_id() + " vs " + b.class_id());
  int window = 0;
  if (keyed_by_window(a.mask)) {
    window = std::abs(bucket_exponent(a.window_bucket, "window") - bucket_exponent(b.window_bucket, "window")) +
             (a.window_causal != b.window_causal);
  }
  return std::abs(bucket_exponent(a.seqlen_q_bucket, "seqlen_q") - bucket_exponent(b.seqlen_q_bucket, "seqlen_q")) +
         std::abs(bucket_exponent(a.seqlen_k_bucket, "seqlen_k") - bucket_exponent(b.seqlen_k_bucket, "seqlen_k")) +
         std::abs(bucket_exponent(a.batch_heads_bucket, "batch_heads") -
                  bucket_exponent(b.batch_heads_bucket, "batch_heads")) +
         window;
}

}  // namespace flashgen
