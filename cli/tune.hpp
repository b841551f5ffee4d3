// What `flashgen tune` shares with its --devices supervisor (cli/tune_workers.cpp) and with its compile phase
// (`flashgen compile --spec`, cli/compile_spec.cpp): the problems of a run, a spec file, the shard of a task, how a
// dry run lists them, and the supervisor itself.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/common.hpp"
#include "tuner/tune.hpp"

namespace flashgen::cli {

// The problem tune's flags describe (every flag has a default; a spec's problems start from it).
AttentionProblem problem_from_flags(const Args& args);

// A spec file's problems and its "max_candidates".
struct TuneSpec {
  std::vector<AttentionProblem> problems;
  std::optional<size_t> max_candidates;
};

// A JSON spec (`flashgen tune --help` shows its format); every error names the file and the field. Omitted problem
// fields take `defaults`.
TuneSpec read_tune_spec(const std::string& path, const AttentionProblem& defaults);

// The share of a spec's problems one task takes: problems index, index + count, ...
struct Shard {
  int index = 0;
  int count = 1;
  std::string source;  // "--shard", "SLURM_PROCID/SLURM_NTASKS", ... or "" when not sharded
};

// --shard, else the Slurm task's (its rank in the job step, its index in a job array, or both), else the Open MPI
// rank and size, else the whole sweep. Only a --spec's problems are sharded: a single problem given by flags is
// tuned whole, in whichever task runs it.
Shard shard_of(const Args& args);

// --variant's user variant given to every problem (nothing when user is null); the problems it cannot go with (packed
// and KV-cache ones, a soft cap or ALiBi beside its score_mod, a backward without its score_grad) are usage errors.
void attach_variant_to(std::vector<AttentionProblem>& problems, const std::shared_ptr<const UserVariant>& user,
                       const Args& args);

// One line on the problem, for a dry run's list and the progress of a sweep.
std::string problem_line(const AttentionProblem& p);

// A problem's spec entry (read_tune_spec's format).
Json problem_json(const AttentionProblem& p);

// A dry run's problems as spec entries, each with the candidates a sweep would time on the one --arch (90 by
// default; plan_tune's list, or the names given with --candidates as they are).
Json dry_run_entries(const Args& args, const std::vector<AttentionProblem>& problems, const std::vector<std::string>& named,
                     size_t max_candidates);

// `tune --devices`: one worker process per GPU over its share of the problems, each into its own file in
// <db>.workers/; a worker that dies is restarted (resuming) without the candidate its journal names;
// finally every worker's rows are merged into db.
int supervise_workers(const Args& args, const std::vector<AttentionProblem>& problems, const fs::path& db,
                      std::optional<size_t> max_candidates);

}  // namespace flashgen::cli
