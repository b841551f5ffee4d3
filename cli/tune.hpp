// What `flashgen tune` shares with its --devices supervisor (cli/tune_workers.cpp): the problems of a
// run, how a dry run lists them, and the supervisor itself.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/common.hpp"
#include "tuner/tune.hpp"

namespace flashgen::cli {

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
