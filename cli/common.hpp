// What several commands of the flashgen tool share: JSON output, input and output files, --arch parsing,
// mask and pass names, config names, the tuning database's --db, and a CUDA stream.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"
#include "problem/attention_problem.hpp"
#include "runtime/cuda_driver.hpp"
#include "tuner/store.hpp"

namespace flashgen::cli {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// JSON text for output: bytes that are not UTF-8 (a path or a name from the command line, a stored
// detail) become U+FFFD instead of an exception.
std::string json_text(const Json& j, int indent = 2);
void print_json(const Json& j);

double ms_since(Clock::time_point start);

// "sm_90a" for Hopper (what NVRTC targets there), "sm_80" otherwise: arch_flag() without "-arch=".
std::string arch_label(int arch);

// Refuses a directory where a file is meant (what names it: "--db", "output").
void reject_directory(const fs::path& path, const std::string& what);

// An input file, opened, or an invalid-argument error saying why it cannot be read (what names it).
std::ifstream open_input(const std::string& path, const std::string& what);

// Writes bytes to path ("-": standard output). A regular file (or a new one) is written beside it first and
// renamed over it with the old file's mode, so a failed write (full disk, a signal) leaves the old file whole;
// other targets (/dev/stdout, a pipe) are written in place. A symbolic link's target is what gets replaced.
void write_file(const std::string& path, const std::string& bytes);

// A JSON file ("-": stdin), parsed; an invalid-argument error when it cannot be read or is not JSON (what names it).
Json read_json_file(const std::string& path, const std::string& what = "file");

std::string first_line(const std::string& text);

// The value of an environment variable, or nullopt when unset or empty.
std::optional<std::string> env(const char* name);

// The cores this process may run on (its CPU affinity, as Slurm or taskset set it): how many kernels compile, or
// reference rows are computed, at a time by default.
int default_jobs();

// The sm numbers >= sm_80 that the NVRTC in this process can target, ascending; nullopt when it cannot
// list them (NVRTC before 11.2).
const std::optional<std::vector<int>>& nvrtc_archs();

// "80, 86, 89, 90 (sm_90a), 100 (sm_100a), 120": the targets --arch accepts, for help and errors.
std::string accepted_archs_text();

// The help paragraph on SM values, shared by emit and compile.
std::string arch_help();

// --arch values (repeatable, or comma-separated: --arch 80,90; a target's name such as sm_90a or sm_80 too), each
// one NVRTC targets.
std::vector<int> parse_archs(const Args& args, const std::vector<int>& fallback);

// The spellings of the masks in --causal, specs and reports: "none", "bottom-right", "top-left" (and "window" in
// reports of a windowed problem).
std::string causal_text(Mask mask);
Mask mask_from_text(const std::string& text);  // one of --causal's spellings

// A problem's mask as reports print it: causal_text, with a window's sides: "window (128, 0)".
std::string mask_description(const AttentionProblem& problem);

// --causal and --window L,R (flashgen.h's window, FlashAttention's window_size: -1 for no bound on a side, and
// with --causal bottom-right a right side of 0, a causal window) onto problem's mask (AttentionProblem::set_mask).
// A window with --causal top-left, or a side below -1, is an error naming the flag.
void mask_from_flags(const Args& args, AttentionProblem& problem);

// "forward", "backward", "backward (deterministic)", "forward against a [paged] KV cache"; a packed batch's
// pass says "of a packed batch", e.g. "backward of a packed batch".
const char* pass_text(const AttentionProblem& problem);

// Makes problem a packed (varlen) one of its shape's batch sequences: total_q and total_k tokens, each by
// default what spreads the lengths evenly from the longest (seqlen_q, seqlen_k) down to 1/64 of it
// (packed_lengths). Errors name the flag or spec field: what_q and what_k ("--total-q", "problems[0].total_q").
void make_packed(AttentionProblem& problem, std::optional<int64_t> total_q, std::optional<int64_t> total_k,
                 const std::string& what_q, const std::string& what_k);

// --varlen, --total-q and --total-k of a command (run, tune) onto problem, whose shape and kv_cache the other
// flags have set: make_packed with the flags' totals; --total-q/-k without --varlen, or --varlen with a KV-cache
// problem, are refused.
void packed_from_flags(const Args& args, AttentionProblem& problem);

// --cache-dtype of a command (run, tune) onto a KV-cache problem: e4m3 or e5m2, an FP8 cache; refused without
// --kv-cache.
inline constexpr const char* kCacheDtypeHelp =
    "with --kv-cache: e4m3 or e5m2, an FP8 cache (keys and values widened to --dtype as they are read; default: the "
    "cache holds --dtype)";
void cache_dtype_from_flags(const Args& args, AttentionProblem& problem);

// A kernel config or module of any kind, as emit and compile take them by name.
using AnyConfig = std::variant<KernelConfig, BwdConfig, DecodeConfig>;

// A config name of any kind: bwd_... names are backward modules, dec_... KV-cache (decode) modules.
AnyConfig config_from_name(const std::string& name);

// --db, else the default database; a directory (or a path ending in '/') is refused.
fs::path db_path_of(const Args& args);

// One stored winner as `db list --json` prints it.
Json choice_json(const StoredChoice& choice);

class Stream {
 public:
  Stream() { FLASHGEN_CU_CHECK(cuStreamCreate(&stream_, CU_STREAM_DEFAULT)); }
  ~Stream() { driver().cuStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

}  // namespace flashgen::cli
