// `flashgen db`: reads and edits the tuning database (list, show, export, import, merge, prune) and writes a
// sweep report of it (report), refusing a damaged file or another program's database instead of reading it as
// empty or replacing it.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/table.hpp"
#include "flashgen/error.hpp"
#include "tuner/report.hpp"
#include "tuner/store.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen::cli {

Command db_command() {
  return Command("db",
                 "Reads and edits the tuning database: every candidate's timing per (device, problem) and the\n"
                 "winner that the run-time choice uses; writes a report of its sweeps to look at.",
                 "<list|show|export|import|merge|prune|report> [arguments] [options]", -1,
                 "actions:\n"
                 "  list                    one line per stored winner: device, problem, config, median ms\n"
                 "  show <problem-text>     the winners whose problem id contains the text, with every\n"
                 "                          candidate row (status, median, spread, samples, detail)\n"
                 "  export [-o FILE]        every row as JSON, to stdout or FILE\n"
                 "  import FILE             merges a JSON export (FILE may be -) into the database\n"
                 "  merge OUT IN1 [IN2...]  merges database files (each read-only) into the database file OUT\n"
                 "  prune                   removes the rows of --device and/or --problem-class (or --all)\n"
                 "  report --html FILE      one self-contained HTML page (inline SVG, no script or network):\n"
                 "                          per problem, every candidate's time against each knob with the\n"
                 "                          winner and the built-in choice marked, the winner against the\n"
                 "                          GPU's datasheet peak, and the problem across the database's GPUs")
      .option("db", "PATH", "the database (default: " + TuningStore::default_path().string() + ")")
      .option("output", "FILE", "export: write to FILE (replaced whole) instead of stdout; - is stdout", false, 'o')
      .option("device", "ID", "prune: only rows of this device id (as `db list` prints it)")
      .option("problem-class", "CLASS", "prune: only rows of this problem class, e.g. fwd|bf16|d128|causal|g1")
      .flag("all", "prune: allow removing every row when no filter is given")
      .option("html", "FILE", "report: write the page to FILE (replaced whole; - is stdout)")
      .option("problem", "TEXT", "report: only problems whose id contains TEXT (any of several)", true)
      .option("gpu", "TEXT", "report: only GPUs whose name or device id contains TEXT, any case", true)
      .option("arch", "SM", "report: only devices of this sm, e.g. 90", true)
      .flag("json", "print JSON (list, show, import, merge, prune, report)");
}

namespace {

// A database the command writes: a damaged file or another program's database would be moved aside to
// start a fresh one, which the library does for its own default file but a command naming it should not.
void refuse_unusable_output(const fs::path& path, const std::string& consequence) {
  if (auto why = TuningStore::why_unusable(path))
    fail(Status::kInvalidArgument, "'" + path.string() + "' is " + *why + "; " + consequence +
                                       " (move it away or name another file)");
}

// A database the command reads, opened read-only; refused (naming it as `name`, the message ending in
// consequence) when it is damaged, another program's or otherwise unreadable rather than read as empty. A
// missing one is empty.
std::unique_ptr<TuningStore> open_read_only(const fs::path& path, const std::string& name,
                                            const std::string& consequence = "") {
  if (auto why = TuningStore::why_unusable(path)) fail(Status::kInvalidArgument, name + " is " + *why + consequence);
  auto store = std::make_unique<TuningStore>(path, true);
  if (store->unreadable()) fail(Status::kInvalidArgument, name + " is " + *store->unreadable() + consequence);
  return store;
}

Json candidate_json(const CandidateResult& c) {
  return {{"config", flashgen::config_name(c.config)}, {"status", candidate_status_name(c.status)},
          {"median_ms", c.median_ms}, {"spread", c.spread}, {"samples", c.samples}, {"detail", c.detail}};
}

void print_winners(const std::vector<StoredChoice>& winners, std::ostream& os) {
  Table table({"device", "problem", "config", "median ms"});
  for (const StoredChoice& w : winners)
    table.add({w.device.id(), w.problem.id(), flashgen::config_name(w.config), format("%.4f", w.median_ms)});
  table.print(os);
}

}  // namespace

int command_db(const Args& args) {
  if (args.positionals.empty())
    throw UsageError("db needs an action: list, show, export, import, merge, prune or report", args.usage());
  const std::string action = args.positionals[0];
  const std::vector<std::string> operands(args.positionals.begin() + 1, args.positionals.end());
  const bool json = args.has("json");
  const fs::path db_path = db_path_of(args);

  // Each option belongs to one action; anything else is a mistake worth reporting.
  auto allow = [&](const std::vector<std::string>& options) {
    for (const char* name : {"output", "device", "problem-class", "all", "html", "problem", "gpu", "arch"})
      if (args.has(name) && std::find(options.begin(), options.end(), name) == options.end())
        throw UsageError("--" + std::string(name) + " does not apply to 'db " + action + "'", args.usage());
  };
  auto operand_count = [&](size_t lo, size_t hi, const char* what) {
    if (operands.size() < lo || operands.size() > hi)
      throw UsageError("'db " + action + "' takes " + what, args.usage());
  };
  auto readable = [&] {
    // A --db that names no file is a mistyped path, not an empty database (the default one may not exist yet).
    if (args.has("db") && !fs::exists(db_path))
      fail(Status::kInvalidArgument, "no database file '" + db_path.string() + "'");
    return open_read_only(db_path, "tuning database " + db_path.string());
  };

  if (action == "list") {
    allow({});
    operand_count(0, 0, "no arguments");
    const std::vector<StoredChoice> winners = readable()->winners();
    if (json) {
      Json array = Json::array();
      for (const StoredChoice& w : winners) array.push_back(choice_json(w));
      print_json(array);
    } else if (winners.empty()) {
      std::cout << "no tuning results in " << db_path.string() << '\n';
    } else {
      print_winners(winners, std::cout);
    }
    return 0;
  }
  if (action == "show") {
    allow({});
    operand_count(1, 1, "one problem id or part of one");
    const std::unique_ptr<TuningStore> opened = readable();
    const TuningStore& store = *opened;
    Json array = Json::array();
    size_t matched = 0;
    for (const StoredChoice& w : store.winners()) {
      if (w.problem.id().find(operands[0]) == std::string::npos) continue;
      ++matched;
      const std::vector<CandidateResult> rows = store.candidates(w.device, w.problem);
      if (json) {
        Json entry = choice_json(w);
        entry["candidates"] = Json::array();
        for (const CandidateResult& c : rows) entry["candidates"].push_back(candidate_json(c));
        array.push_back(std::move(entry));
        continue;
      }
      std::cout << (matched > 1 ? "\n" : "") << "device:  " << w.device.id() << '\n'
                << "problem: " << w.problem.id() << '\n'
                << format("winner:  %s, %.4f ms\n", flashgen::config_name(w.config).c_str(), w.median_ms);
      Table table({"config", "status", "median ms", "spread", "samples", "detail"});
      for (const CandidateResult& c : rows) {
        const bool timed = c.status == CandidateStatus::kOk;
        table.add({flashgen::config_name(c.config), candidate_status_name(c.status),
                   timed ? format("%.4f", c.median_ms) : "-", timed ? format("%.1f%%", c.spread * 100) : "-",
                   std::to_string(c.samples), first_line(c.detail)});
      }
      table.print(std::cout);
    }
    if (json) print_json(array);
    else if (matched == 0) std::cout << "no stored problem matches '" << operands[0] << "' in " << db_path.string() << '\n';
    return 0;
  }
  if (action == "export") {
    allow({"output"});
    operand_count(0, 0, "no arguments (write to a file with -o FILE)");
    const std::string text = json_text(readable()->export_json()) + "\n";
    if (!args.has("output")) {
      std::cout << text;
      return 0;
    }
    const std::string output = args.string_or("output", "");
    std::error_code error;
    if (fs::equivalent(output, db_path, error))
      fail(Status::kInvalidArgument, "-o '" + output + "' is the database being exported");
    write_file(output, text);
    return 0;
  }
  if (action == "import") {
    allow({});
    operand_count(1, 1, "one JSON file (or - for stdin)");
    const Json data = read_json_file(operands[0]);
    winners_from_export(data, operands[0]);  // a document import would refuse creates no database either
    refuse_unusable_output(db_path, "nothing was imported");
    const int changed = TuningStore(db_path).import_json(data);
    if (json) print_json({{"db", db_path.string()}, {"winners_added_or_replaced", changed}});
    else std::cout << changed << " winners added or replaced in " << db_path.string() << '\n';
    return 0;
  }
  if (action == "merge") {
    allow({});
    if (args.has("db")) throw UsageError("'db merge' names its output file as OUT, not with --db", args.usage());
    operand_count(2, std::numeric_limits<size_t>::max(), "an output file and at least one input file");
    reject_directory(operands[0], "OUT");
    // A missing or damaged input is a mistake, not an empty database: read them all before touching OUT.
    std::vector<Json> inputs;
    for (size_t i = 1; i < operands.size(); ++i) {
      if (!fs::exists(operands[i])) fail(Status::kInvalidArgument, "no database file '" + operands[i] + "'");
      inputs.push_back(open_read_only(operands[i], "database file '" + operands[i] + "'", "; nothing was merged")
                           ->export_json());
    }
    refuse_unusable_output(operands[0], "nothing was merged");
    TuningStore out(operands[0]);
    int changed = 0;
    for (const Json& input : inputs) changed += out.import_json(input);
    if (json) {
      const std::vector<std::string> inputs(operands.begin() + 1, operands.end());
      print_json({{"db", operands[0]}, {"inputs", inputs}, {"winners_added_or_replaced", changed}});
    } else {
      std::cout << "merged " << operands.size() - 1 << " files into " << operands[0] << ": " << changed
                << " winners added or replaced\n";
    }
    return 0;
  }
  if (action == "report") {
    allow({"html", "problem", "gpu", "arch"});
    operand_count(0, 0, "no arguments (choose rows with --problem, --gpu and --arch)");
    if (!args.has("html")) throw UsageError("'db report' needs --html FILE, the page to write", args.usage());
    const std::string output = args.string_or("html", "");
    if (output == "-" && json) throw UsageError("--json and --html - would both write to stdout", args.usage());
    std::error_code error;
    if (fs::equivalent(output, db_path, error))
      fail(Status::kInvalidArgument, "--html '" + output + "' is the database being reported");
    ReportFilter filter;
    filter.problems = args.values("problem");
    filter.gpus = args.values("gpu");
    for (const std::string& sm : args.values("arch"))
      filter.archs.push_back(static_cast<int>(args.parse_int("arch", sm, 10, 999)));
    const ReportData data = read_report(*readable(), filter);
    const bool filtered = !filter.problems.empty() || !filter.gpus.empty() || !filter.archs.empty();
    // A filter that matches nothing is a mistyped id or name, not a report worth writing.
    if (filtered && data.problems.empty())
      fail(Status::kInvalidArgument, "no stored sweep in " + db_path.string() + " matches the --problem, --gpu and "
                                     "--arch filters (`flashgen db list` shows the problems and devices)");
    write_file(output, render_report_html(data));
    size_t sweeps = 0, candidates = 0;
    for (const ReportProblem& p : data.problems) {
      sweeps += p.sweeps.size();
      for (const ReportSweep& s : p.sweeps) candidates += s.candidates.size();
    }
    if (json) {
      print_json({{"db", db_path.string()}, {"html", output}, {"problems", data.problems.size()},
                  {"sweeps", sweeps}, {"candidates", candidates}});
    } else if (output != "-") {
      std::cout << "wrote " << output << ": " << data.problems.size() << " problems, " << sweeps << " sweeps, "
                << candidates << " candidates\n";
    }
    return 0;
  }
  if (action == "prune") {
    allow({"device", "problem-class", "all"});
    operand_count(0, 0, "no arguments (filter with --device and --problem-class)");
    const std::string device = args.string_or("device", "");
    const std::string problem_class = args.string_or("problem-class", "");
    if (device.empty() && problem_class.empty() && !args.has("all"))
      throw UsageError("prune without --device or --problem-class removes every row: pass --all to mean that",
                       args.usage());
    // Pruning a file that is not there, or damaged, would create or replace one and report 0 rows.
    if (!fs::exists(db_path)) fail(Status::kInvalidArgument, "no database file '" + db_path.string() + "'");
    readable();
    TuningStore store(db_path);
    // prune() counts rows of both tables (winners and candidates); the winners are what `db list` shows.
    const size_t winners_before = store.winners().size();
    const int removed = store.prune(device, problem_class);
    const size_t winners_removed = winners_before - store.winners().size();
    if (json)
      print_json({{"db", db_path.string()}, {"removed", removed}, {"winners_removed", winners_removed}});
    else
      std::cout << "removed " << removed << " rows (" << winners_removed << " winners) from " << db_path.string()
                << '\n';
    // A whole problem id (as `db list` prints them) matches no class: say what the class of it would be.
    size_t fifth_bar = 0;
    for (int bars = 0; bars < 5 && fifth_bar != std::string::npos; ++bars)
      fifth_bar = problem_class.find('|', bars == 0 ? 0 : fifth_bar + 1);
    if (removed == 0 && fifth_bar != std::string::npos) {
      std::cerr << "note: --problem-class takes a class, a problem id's first five fields ('"
                << problem_class.substr(0, fifth_bar) << "'), not a whole problem id\n";
    }
    return 0;
  }
  throw UsageError("unknown db action '" + action + "'", args.usage());
}

}  // namespace flashgen::cli
