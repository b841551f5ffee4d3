// Dispatch's planner: the refinements that turn a call into the config it runs, in one order, each a named step that
// appends its reason, so the reason explain reports names what runs. What the steps read from outside (data sources,
// sweeps, ptxas's spill reports, the config's can_implement) comes in PlanSources: dispatch.cpp gives the process's,
// tests/dispatch/test_planner.cpp fakes.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/attention_kvcache.hpp"
#include "tuner/choice.hpp"
#include "tuner/problem_key.hpp"

namespace flashgen {

// What the planner of a call of one pass (ForwardChoice or BackwardChoice) reads from outside.
template <class Choice>
struct PlanSources {
  using Config = decltype(Choice::config);
  int arch = 0;
  // The process's data sources' answer for a problem key: the user's database, the shipped defaults, else the
  // heuristic's ranked candidates (resolved by spilled_bytes).
  std::function<SourcesAnswer<Choice>(const ProblemKey&)> choose;
  // The first-use sweep of the call's problem (its winner, or nullopt with *failure set); empty while
  // tune-on-first-use is off.
  std::function<std::optional<Choice>(std::string* failure)> tune;
  bool tuning_deferred = false;  // tune-on-first-use is on but the stream captures a graph: no sweep may run
  SpilledBytes<Config> spilled_bytes;  // on sm_<arch>
  std::function<Implementability(const Config&)> can_implement;  // the config's, for the call on its device
  std::function<std::vector<Config>()> sm80_candidates;  // the heuristic's sm80 family for the call's class, ranked
  // A packed forward's choice read through a block table (tuner/choice.hpp's read_through_pages); the forward's only.
  std::function<Choice(Choice)> read_through_pages;
};

// A planned choice, with what the steps after the first need to know of it.
template <class Choice>
struct Plan {
  Choice choice;
  bool variant_timed = false;  // the tiles were timed with the call's user variant (its own tuning data)
  bool final = true;           // false where tune-on-first-use was deferred: the plan serves this call only
};

// The config a forward or backward call runs, in this order:
//   1. stored_or_builtin: the stored winner for the call's key (a user variant's own data, else its base class's), or
//      the heuristic's first candidate that does not spill;
//   2. first_use_tune: tune-on-first-use's winner where the database lacks the problem's own bucket;
//   3. paged: a packed forward over a block table reads through its pages;
//   4. with_user_variant: the variant's functions compiled in (other tiles of the list where the chosen ones spill);
//   5. fallbacks: while the config's can_implement says the family cannot run the call, the fallback for what it
//      lacks (the first of the sm80 family's candidates that does not spill, fitted by steps 3 and 4; or no
//      persistent walk); a shortfall no fallback removes (another problem, the arch, the grid) is left to the
//      launcher, which reports it.
// Every compile result a step needs (spills) comes from sources.spilled_bytes; the data sources compile nothing.
Plan<ForwardChoice> plan_call(const ForwardCall& call, const PlanSources<ForwardChoice>& sources);
Plan<BackwardChoice> plan_call(const BackwardCall& call, const PlanSources<BackwardChoice>& sources);

// The config and split count a KV-cache call runs, in this order:
//   1. stored_or_builtin: choose() (the user's database, the shipped defaults, the built-in heuristic);
//   2. with_user_variant: the base class's choice with the variant's functions compiled in;
//   3. split_count: the call's requested count, else the chosen one, at most the key blocks its rows visit.
DecodeChoice plan_call(const KvCacheCall& call, const std::function<DecodeChoice()>& choose);

}  // namespace flashgen
