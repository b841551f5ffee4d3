// `flashgen demo`, the main job: with a GPU, `run` of the default problem and a one-line summary;
// without one, `compile` of the default candidates for sm_80 and sm_90a.
#include <iostream>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/compile.hpp"
#include "cli/run.hpp"
#include "cli/table.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen::cli {

Command demo_command() {
  return Command("demo",
                 "The main job. With a GPU: runs, checks and times the default problem of `flashgen run`\n"
                 "(batch 4, seqlen 4096, 16 heads, head_dim 128, fp16). Without one: compiles the default\n"
                 "candidates for sm_80 and sm_90a and prints their table.",
                 "[--jobs N]")
      .option("jobs", "N", "without a GPU: compile N kernels at a time (default: the number of cores)", false, 'j');
}

int command_demo(const Args& args) {
  const int threads = static_cast<int>(args.int_or("jobs", default_jobs(), 1, 1024));
  std::string why;
  if (driver_available(&why)) {
    const RunReport report = run_problem(RunOptions{});
    print_run_report(report, std::cout);
    std::cout << format("\n%s on %s: %.3f ms, ", report.config_name.c_str(), report.device_name.c_str(),
                        report.median_ms())
              << tflops_text(report.tflops()) << ", check " << (report.check.pass() ? "PASS" : "FAIL") << '\n';
    return report.check.pass() ? 0 : 1;
  }
  const Clock::time_point start = Clock::now();
  const std::vector<CompileOutcome> outcomes = compile_jobs(default_jobs_for(kDefaultArchs), true, threads);
  print_compile_table(outcomes, std::cout);
  const size_t failed = report_compile_summary(outcomes, ms_since(start));
  std::cout << "No GPU found (" << why << "): compiled only; timing needs a GPU.\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace flashgen::cli
