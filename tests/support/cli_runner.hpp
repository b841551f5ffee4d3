// Runs the built `flashgen` CLI (FLASHGEN_CLI_PATH) for the [cli] tests, isolated from the user's own
// kernel cache and tuning database (both point inside the test's temporary directory) and, where a test asks, from
// the scheduler it may run under.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "support/temp_dir.hpp"

namespace flashgen::testing {

struct CliResult {
  int exit_code = -1;  // -1 when the CLI did not exit normally (a signal)
  std::string out;
  std::string err;
};

// The scheduler variables that pick a shard (Slurm's and Open MPI's), cleared for the scope and again at its end,
// whatever the test set in between (popen passes the test process's environment on to the CLI).
class NoSchedulerEnv {
 public:
  NoSchedulerEnv() { clear(); }
  ~NoSchedulerEnv() { clear(); }
  NoSchedulerEnv(const NoSchedulerEnv&) = delete;
  NoSchedulerEnv& operator=(const NoSchedulerEnv&) = delete;

 private:
  static void clear() {
    for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                             "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP", "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE"})
      ::unsetenv(name);
  }
};

// The word quoted for /bin/sh.
inline std::string shell_quote(const std::string& word) {
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Runs `flashgen <args>` with FLASHGEN_CACHE_DIR and FLASHGEN_TUNING_DB inside dir; stdout through a
// pipe, stderr via a file.
inline CliResult run_cli(const std::vector<std::string>& args, const TempDir& dir) {
  const std::filesystem::path err_path = dir.path() / "stderr.txt";
  std::string command = "FLASHGEN_CACHE_DIR=" + shell_quote((dir.path() / "cache").string()) +
                        " FLASHGEN_TUNING_DB=" + shell_quote((dir.path() / "default.sqlite").string()) + " " +
                        shell_quote(FLASHGEN_CLI_PATH);
  for (const std::string& arg : args) command += " " + shell_quote(arg);
  command += " 2>" + shell_quote(err_path.string());
  INFO("command: " << command);
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  CliResult result;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path, std::ios::binary);
  result.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  return result;
}

// stdout parsed as JSON; a parse failure fails the test and shows the text.
inline nlohmann::json parse_json(const CliResult& result) {
  INFO("exit " << result.exit_code << "\nstdout: " << result.out << "\nstderr: " << result.err);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(result.out));
  return j;
}

// A tune spec's JSON text written to dir/spec.json; returns the path.
inline std::string write_spec(const TempDir& dir, const std::string& text) {
  const std::string path = (dir.path() / "spec.json").string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace flashgen::testing
