// The `flashgen` command-line tool: its list of commands (each in its own file, declared in cli/commands.hpp),
// the dispatch to them, `flashgen help`, and the exit status and --json error object of a failure.
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "flashgen/error.hpp"

namespace flashgen::cli {
namespace {

struct Subcommand {
  Command command;
  std::function<int(const Args&)> run;
};

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> list = {
      {info_command(), command_info},       {emit_command(), command_emit}, {compile_command(), command_compile},
      {run_command(), command_run},         {demo_command(), command_demo},
      {tune_command(), command_tune},       {db_command(), command_db},
  };
  return list;
}

std::string top_usage() {
  std::string text =
      "usage: flashgen <command> [options]\n\n"
      "flashgen generates flash-attention CUDA kernels from templates and compiles them at run time\n"
      "with NVRTC for the GPU in hand.\n\ncommands:\n";
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"info", "versions, kernel cache and GPUs"},
      {"emit", "print a kernel's generated CUDA source as one translation unit"},
      {"compile", "compile kernels with NVRTC and show registers, shared memory, spills"},
      {"run", "run, check and time one attention problem on the GPU"},
      {"demo", "the main job: run the default problem, or compile the defaults without a GPU"},
      {"tune", "sweep the forward or backward configs of problems on the GPU and store the winners"},
      {"db", "list, show, export, import, merge, prune or report on the tuning database"},
      {"help", "this list; `flashgen help <command>` or `flashgen <command> --help` for one command"},
  };
  for (const auto& row : rows) text += "  " + row.first + std::string(10 - row.first.size(), ' ') + row.second + "\n";
  text += "\nexit status: 0 success, 1 a failed check or compile (or an internal error), 2 a bad argument or an\n"
          "unsupported request, 3 a GPU is needed and none is usable. With --json, errors are printed as\n"
          "{\"error\": ..., \"status\": ...} on standard output.\n";
  return text;
}

const Subcommand* find_subcommand(const std::string& name) {
  for (const Subcommand& sub : subcommands())
    if (sub.command.name() == name) return &sub;
  return nullptr;
}

int dispatch(const std::vector<std::string>& words) {
  if (words.empty() || words[0] == "--help" || words[0] == "-h" || (words[0] == "help" && words.size() == 1)) {
    std::cout << top_usage();
    return 0;
  }
  if (words[0] == "--version") {
    std::cout << "flashgen " << FLASHGEN_VERSION << '\n';
    return 0;
  }
  if (words[0] == "help") {
    if (words.size() > 2) throw UsageError("help takes one command name", top_usage());
    if (words[1] == "--help" || words[1] == "-h") {
      std::cout << top_usage();
      return 0;
    }
    const Subcommand* sub = find_subcommand(words[1]);
    if (!sub) throw UsageError("unknown command '" + words[1] + "'", top_usage());
    std::cout << sub->command.usage();
    return 0;
  }
  const Subcommand* sub = find_subcommand(words[0]);
  if (!sub) {
    const bool is_flag = !words[0].empty() && words[0][0] == '-';
    throw UsageError(std::string(is_flag ? "unknown option '" : "unknown command '") + words[0] + "'", top_usage());
  }
  const std::optional<Args> args = sub->command.parse({words.begin() + 1, words.end()});
  if (!args) {
    std::cout << sub->command.usage();
    return 0;
  }
  return sub->run(*args);
}

int exit_code_for(Status status) {
  switch (status) {
    case Status::kInvalidArgument:
    case Status::kUnsupported: return 2;
    case Status::kNoDevice: return 3;
    default: return 1;
  }
}

// The "status" of a JSON error object: the C ABI's FLASHGEN_ERROR_* name in lower case.
const char* status_name(Status status) {
  switch (status) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid_argument";
    case Status::kUnsupported: return "unsupported";
    case Status::kNoDevice: return "no_device";
    case Status::kCompile: return "compile";
    case Status::kCuda: return "cuda";
    case Status::kInternal: return "internal";
  }
  return "internal";
}

// Whether the command line asks for JSON: --json before any "--" that ends the options.
bool wants_json(const std::vector<std::string>& words) {
  for (const std::string& word : words) {
    if (word == "--") return false;
    if (word == "--json") return true;
  }
  return false;
}

// Reports a failure that reached main and returns the exit code. The message goes to stderr, followed
// by a usage error's reminder (a command's synopsis, or flashgen's whole short usage); with --json, stdout also gets
// one object {"error": message, "status": status_name} for scripts, whatever the command.
int report_failure(bool json, Status status, const std::string& message, const std::string& usage = "") {
  std::cerr << "flashgen: error: " << message << '\n';
  if (!usage.empty()) std::cerr << '\n' << usage;
  if (json) print_json({{"error", message}, {"status", status_name(status)}});
  return exit_code_for(status);
}

}  // namespace
}  // namespace flashgen::cli

int main(int argc, char** argv) {
  using namespace flashgen::cli;
  using flashgen::Status;
  const std::vector<std::string> words(argv + 1, argv + argc);
  const bool json = wants_json(words);
  try {
    const int code = dispatch(words);
    // What the command printed must have reached its reader (a full disk, a closed pipe): else it failed.
    std::cout.flush();
    if (!std::cout) throw flashgen::Error(Status::kInternal, "cannot write to standard output");
    return code;
  } catch (const UsageError& error) {  // exit 2
    return report_failure(json, Status::kInvalidArgument, error.what(), error.usage());
  } catch (const flashgen::Error& error) {
    return report_failure(json, error.status(), error.what());
  } catch (const std::exception& error) {  // exit 1
    return report_failure(json, Status::kInternal, error.what());
  }
}
