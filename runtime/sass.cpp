// cuobjdump over a temporary cubin file, its output read through a pipe.
#include "runtime/sass.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "flashgen/error.hpp"

namespace flashgen {
namespace {

std::vector<std::filesystem::path> cuobjdump_candidates() {
  std::vector<std::filesystem::path> candidates;
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && *home != '\0')
    candidates.push_back(std::filesystem::path(home) / "bin" / "cuobjdump");
  candidates.push_back("/usr/local/cuda/bin/cuobjdump");
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (!dir.empty()) candidates.push_back(std::filesystem::path(dir) / "cuobjdump");
  }
  return candidates;
}

std::string shell_quote(const std::string& word) {
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// A temporary file removed when it goes out of scope.
class TempFile {
 public:
  explicit TempFile(const std::string& bytes) {
    static std::atomic<unsigned> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("flashgen-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".cubin");
    std::ofstream out(path_, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) fail(Status::kInternal, "cannot write the temporary cubin " + path_.string());
  }
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace

std::string find_cuobjdump() {
  for (const std::filesystem::path& candidate : cuobjdump_candidates()) {
    std::error_code error;
    if (std::filesystem::is_regular_file(candidate, error) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  }
  return {};
}

std::string require_cuobjdump() {
  std::string cuobjdump = find_cuobjdump();
  if (cuobjdump.empty()) {
    fail(Status::kUnsupported,
         "no cuobjdump to disassemble with: looked in $CUDA_HOME/bin, /usr/local/cuda/bin and $PATH (it ships "
         "with the CUDA toolkit's cuda-cuobjdump package; or write the cubin with `flashgen compile --cubin-dir` "
         "and disassemble it where the toolkit has it)");
  }
  return cuobjdump;
}

std::string disassemble_cubin(const std::string& cubin) {
  const std::string cuobjdump = require_cuobjdump();
  const TempFile file(cubin);
  const std::string command = shell_quote(cuobjdump) + " -sass " + shell_quote(file.path().string()) + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) fail(Status::kInternal, "cannot run " + cuobjdump);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail(Status::kInternal, cuobjdump + " -sass failed: " + text);
  return text;
}

int sass_opcode_count(const std::string& sass, const std::string& opcode) {
  int count = 0;
  for (size_t at = sass.find(opcode); at != std::string::npos; at = sass.find(opcode, at + 1)) {
    const char before = at > 0 ? sass[at - 1] : ' ';
    const char after = at + opcode.size() < sass.size() ? sass[at + opcode.size()] : ' ';
    count += (before == ' ' || before == '}') && (after == '.' || after == ' ');
  }
  return count;
}

}  // namespace flashgen
