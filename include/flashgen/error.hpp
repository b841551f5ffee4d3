// flashgen's exception type. Every failure inside the library throws flashgen::Error with a status
// (the C ABI's code) and a message that carries its evidence: file:line, the call, the API's own text.
#pragma once

#include <stdexcept>
#include <string>

namespace flashgen {

enum class Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,
  kUnsupported = 2,
  kNoDevice = 3,
  kCompile = 4,
  kCuda = 5,
  kInternal = 6,
};

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

[[noreturn]] inline void fail(Status status, const std::string& message) { throw Error(status, message); }

}  // namespace flashgen

// Throws Error(kInvalidArgument) with the message unless cond holds.
#define FLASHGEN_REQUIRE(cond, message)                                                 \
  do {                                                                                  \
    if (!(cond)) ::flashgen::fail(::flashgen::Status::kInvalidArgument, (message));    \
  } while (0)
