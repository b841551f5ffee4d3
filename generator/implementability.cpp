// The launchers' one error for a config that cannot implement a call (implementability.hpp).
#include "generator/implementability.hpp"

#include "flashgen/error.hpp"

namespace flashgen {

void fail_unimplementable(const std::string& config, const Implementability& answer) {
  switch (answer.shortfall) {
    case Shortfall::kProblem:
      fail(Status::kInvalidArgument, "config " + config + " " + answer.reason);
    case Shortfall::kArch:
      fail(Status::kInvalidArgument, "config " + config + " cannot run here: " + answer.reason);
    case Shortfall::kGridLimit:
      fail(Status::kInvalidArgument, answer.reason);  // the reason names the argument, as the tensor checks do
    case Shortfall::kTmaLayout:
      fail(Status::kUnsupported, "config " + config + " needs TMA, which cannot describe " + answer.reason);
    case Shortfall::kTileCount:
      fail(Status::kInvalidArgument, "config " + config + ": " + answer.reason);
    case Shortfall::kNone:
      break;
  }
  fail(Status::kInternal, "config " + config + " was refused without a shortfall");
}

}  // namespace flashgen
