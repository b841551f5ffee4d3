// The process-wide choice of both passes (tuner/choice.hpp's order over the user's database and the shipped
// defaults), memoized per (device, problem key), and the sweeps of tune-on-first-use.
#include "dispatch/select.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "flashgen/error.hpp"
#include "tuner/shipped.hpp"
#include "tuner/store.hpp"
#include "tuner/tune.hpp"

namespace flashgen {

namespace {

// The user's database, opened read-only once per process; null when there is none or it is unusable.
const TuningStore* user_store() {
  static std::once_flag once;
  static std::unique_ptr<TuningStore> store;
  std::call_once(once, [] {
    const std::filesystem::path path = TuningStore::default_path();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return;  // no tuning data: not worth a warning
    try {
      store = std::make_unique<TuningStore>(path, /*read_only=*/true);
    } catch (const Error& e) {
      std::fprintf(stderr, "flashgen: warning: tuning database %s not used: %s\n", path.string().c_str(), e.what());
    }
  });
  return store.get();
}

// Fingerprint of each device, read once.
const DeviceFingerprint& fingerprint_of(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceFingerprint> fingerprints;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = fingerprints.find(device);
  if (found == fingerprints.end()) found = fingerprints.emplace(device, current_device_fingerprint(device)).first;
  return found->second;
}

}  // namespace

namespace {

// SQLite reads through the user store's one connection, one thread at a time.
std::mutex& store_mutex() {
  static std::mutex mutex;
  return mutex;
}

// A problem key's memoized run-time answer (what the data sources hold, or this process's first-use winner) and,
// where this process's first-use sweep of it failed, the cause.
struct Memoized {
  std::variant<std::monostate, SourcesAnswer<ForwardChoice>, SourcesAnswer<BackwardChoice>, DecodeStoredAnswer>
      answer;
  std::optional<std::string> sweep_failure;
};

// The process's one memo of run-time choices, by (device ordinal, problem key id): a key's id names its pass.
struct ChoiceMemo {
  std::mutex mutex;
  std::map<std::pair<int, std::string>, Memoized> entries;
};

ChoiceMemo& choice_memo() {
  static ChoiceMemo memo;
  return memo;
}

// The memoized answer of type Answer for (device, id), if there is one; memo.mutex held.
template <class Answer>
const Answer* memoized(ChoiceMemo& memo, int device, const std::string& id) {
  auto found = memo.entries.find({device, id});
  return found == memo.entries.end() ? nullptr : std::get_if<Answer>(&found->second.answer);
}

// The memoized process-wide answer: choose(fingerprint, user store, shipped defaults) on the first call
// for (device, problem), with the device fingerprint read only when there is any data to match.
template <class Answer, class Choose>
Answer memoized_choice(int device, const ProblemKey& problem, Choose choose) {
  ChoiceMemo& memo = choice_memo();
  const std::string id = problem.id();
  {
    std::lock_guard<std::mutex> lock(memo.mutex);
    if (const Answer* found = memoized<Answer>(memo, device, id)) return *found;
  }
  const TuningStore* store = user_store();
  Answer choice;
  {
    std::lock_guard<std::mutex> lock(store_mutex());
    const ShippedDefaults& shipped = ShippedDefaults::instance();
    const bool any_data = store != nullptr || !shipped.winners().empty();
    choice = choose(any_data ? fingerprint_of(device) : DeviceFingerprint{}, store, &shipped);
  }
  std::lock_guard<std::mutex> lock(memo.mutex);
  // An answer memoized meanwhile (another thread's, or a first-use sweep's winner) stays.
  if (const Answer* found = memoized<Answer>(memo, device, id)) return *found;
  memo.entries[{device, id}].answer = choice;
  return choice;
}

std::atomic<uint64_t>& generation() {
  static std::atomic<uint64_t> count{0};
  return count;
}

std::atomic<int>& tune_switch() {
  // -1: not decided yet (read FLASHGEN_TUNE on first use), 0 off, 1 on.
  static std::atomic<int> state{-1};
  return state;
}

std::mutex& first_use_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Both passes' first-use sweeps: tune(problem) into the user's database, its winner memoized for the
// problem's key. explicit_request (flashgen_tune_forward) sweeps even a bucket the database holds.
template <class Choice>
std::optional<Choice> first_use_tune(const AttentionProblem& problem, int device, int arch, std::string* failure,
                                     bool explicit_request, const UserVariantArgs* user_args) {
  using Config = decltype(Choice::config);
  constexpr bool kBackward = std::is_same_v<Config, BwdConfig>;
  FLASHGEN_REQUIRE(problem.backward() == kBackward, "tuning on first use: the problem is not of the pass asked for");
  const ProblemKey key = problem_key(problem);
  // One first-use sweep at a time in a process, of either pass (two would disturb each other's timings):
  // a second thread asking for the same problem waits and then finds the memoized winner.
  std::lock_guard<std::mutex> sweep_lock(first_use_mutex());
  ChoiceMemo& memo = choice_memo();
  const std::string id = key.id();
  {
    std::lock_guard<std::mutex> lock(memo.mutex);
    const SourcesAnswer<Choice>* found = memoized<SourcesAnswer<Choice>>(memo, device, id);
    if (found != nullptr && found->stored && found->stored->source == ChoiceSource::kTunedOnFirstUse) {
      return found->stored;
    }
    // A bucket whose sweep failed is not swept again by this process (the warning was given once); its
    // cause is kept for the callers' reasons.
    Memoized& entry = memo.entries[{device, id}];
    if (explicit_request) entry.sweep_failure.reset();
    if (entry.sweep_failure) {
      if (failure != nullptr) *failure = *entry.sweep_failure;
      return std::nullopt;
    }
  }
  const std::filesystem::path path = TuningStore::default_path();
  try {
    TuningStore store(path);  // opened first: a database that cannot be written fails before the sweep
    TuneOptions options;
    // Another process may have stored the bucket since this one read the database: then its winner serves.
    options.force = explicit_request;
    options.max_candidates = kFirstUseCandidates;
    if (problem.user) {
      FLASHGEN_REQUIRE(user_args != nullptr, "tuning a user variant needs the call's buffers and scalars of it");
      options.sweep.user_args = *user_args;
    }
    options.on_plan = [&](const TunePlan& plan) {
      std::fprintf(stderr, "flashgen: tuning %s %s(%zu candidates)\n", key.id().c_str(),
                   explicit_request ? "" : "on first use, FLASHGEN_TUNE=1 ", plan.candidates.size());
    };
    const TuneResult result = tune(problem, store, fingerprint_of(device), arch, options);
    const Choice choice =
        result.from_store()
            ? Choice{std::get<Config>(result.winner), "tuning database " + path.string() + ", exact bucket " + key.id(),
                     ChoiceSource::kTuningDatabase, true}
            : Choice{std::get<Config>(result.winner),
                     "tuned on first use: the fastest of " + std::to_string(result.candidates.size()) +
                         " candidates (" + result.decision + "), stored in " + path.string(),
                     ChoiceSource::kTunedOnFirstUse};
    std::lock_guard<std::mutex> lock(memo.mutex);
    SourcesAnswer<Choice> answer;
    answer.stored = choice;
    memo.entries[{device, id}].answer = std::move(answer);
    ++generation();
    return choice;
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(memo.mutex);
      memo.entries[{device, id}].sweep_failure = e.what();
    }
    if (failure != nullptr) *failure = e.what();
    if (explicit_request) {  // the caller's error, with the cause's status (a CUDA or compile failure, a bad path)
      const auto* error = dynamic_cast<const Error*>(&e);
      fail(error != nullptr ? error->status() : Status::kInternal, "tuning " + key.id() + " failed: " + e.what());
    }
    std::fprintf(stderr, "flashgen: warning: tuning %s on first use failed (not tried again in this process): %s\n",
                 key.id().c_str(), e.what());
    return std::nullopt;
  }
}

}  // namespace

SourcesAnswer<ForwardChoice> choose_forward_config(int device, const ProblemKey& problem, int arch) {
  return memoized_choice<SourcesAnswer<ForwardChoice>>(
      device, problem, [&](const DeviceFingerprint& fingerprint, const TuningStore* store,
                           const ShippedDefaults* shipped) {
        return choose_forward_config(fingerprint, problem, arch, store, shipped);
      });
}

bool tune_on_first_use() {
  int state = tune_switch().load();
  if (state < 0) {
    const char* value = std::getenv("FLASHGEN_TUNE");
    const int from_env = value != nullptr && std::string(value) == "1" ? 1 : 0;
    tune_switch().compare_exchange_strong(state, from_env);
    state = tune_switch().load();
  }
  return state == 1;
}

void set_tune_on_first_use(bool enabled) {
  tune_switch().store(enabled ? 1 : 0);
  ++generation();
}

uint64_t choice_generation() { return generation().load(std::memory_order_acquire); }

std::optional<ForwardChoice> tune_forward_on_first_use(const AttentionProblem& problem, int device, int arch,
                                                       std::string* failure, bool explicit_request,
                                                       const UserVariantArgs* user_args) {
  return first_use_tune<ForwardChoice>(problem, device, arch, failure, explicit_request, user_args);
}

std::optional<BackwardChoice> tune_backward_on_first_use(const AttentionProblem& problem, int device, int arch,
                                                         std::string* failure, const UserVariantArgs* user_args) {
  return first_use_tune<BackwardChoice>(problem, device, arch, failure, false, user_args);
}

SourcesAnswer<BackwardChoice> choose_backward_config(int device, const ProblemKey& problem, int arch) {
  return memoized_choice<SourcesAnswer<BackwardChoice>>(
      device, problem, [&](const DeviceFingerprint& fingerprint, const TuningStore* store,
                           const ShippedDefaults* shipped) {
        return choose_backward_config(fingerprint, problem, arch, store, shipped);
      });
}

DecodeChoice choose_decode_config(int device, const AttentionProblem& problem, int arch, int multiprocessors) {
  const DecodeStoredAnswer answer = memoized_choice<DecodeStoredAnswer>(
      device, problem_key(problem), [&](const DeviceFingerprint& fingerprint, const TuningStore* store,
                                        const ShippedDefaults* shipped) {
        return decode_stored_answer(fingerprint, problem, arch, store, shipped);
      });
  return complete_decode_choice(answer, problem, arch, multiprocessors);
}

}  // namespace flashgen
