// Tests for runtime/kernel_cache: round trip, damaged entries, read-only directories, several
// processes racing for one key (exactly one produces, all read the same bytes), and the same race where flock
// fails as on NFS without a lock daemon (each may produce; every entry read is one whole copy).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "runtime/kernel_cache.hpp"
#include "support/temp_dir.hpp"

// Whether flock fails with ENOLCK, as on an NFS mount without a lock daemon (FailingLocks sets it), and how many
// calls it refused.
std::atomic<bool> g_flock_fails{false};
std::atomic<int> g_flock_refused{0};

// flock as this test program sees it: the C library's, or ENOLCK while g_flock_fails. Defined in the program, it
// takes the C library's place for libflashgen too, whose kernel cache is what the failing case tests.
extern "C" int flock(int fd, int operation) {
  using Flock = int (*)(int, int);
  static const Flock next = reinterpret_cast<Flock>(::dlsym(RTLD_NEXT, "flock"));
  if (g_flock_fails.load()) {
    ++g_flock_refused;
    errno = ENOLCK;
    return -1;
  }
  return next(fd, operation);
}

namespace {

using flashgen::testing::TempDir;

// flock fails for the scope (and in processes forked within it).
class FailingLocks {
 public:
  FailingLocks() {
    g_flock_refused = 0;
    g_flock_fails = true;
  }
  ~FailingLocks() { g_flock_fails = false; }
  int refused() const { return g_flock_refused.load(); }
  FailingLocks(const FailingLocks&) = delete;
  FailingLocks& operator=(const FailingLocks&) = delete;
};

namespace fs = std::filesystem;


std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Binary payload with NULs and high bytes, like a cubin.
std::string sample_payload() {
  std::string bytes("\x7f" "ELF\0\1\2\3", 8);
  for (int i = 0; i < 1000; ++i) bytes.push_back(static_cast<char>(i * 37));
  return bytes;
}

}  // namespace

TEST_CASE("kernel cache stores and loads an entry", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  flashgen::KernelCache cache(temp.path() / "nested" / "cache");
  const std::string payload = sample_payload();

  CHECK_FALSE(cache.load("fwd_sm80_fp16_d128-sm80-abc").has_value());
  cache.store("fwd_sm80_fp16_d128-sm80-abc", payload);
  CHECK(fs::exists(cache.path_for("fwd_sm80_fp16_d128-sm80-abc")));
  auto loaded = cache.load("fwd_sm80_fp16_d128-sm80-abc");
  REQUIRE(loaded.has_value());
  CHECK(*loaded == payload);

  cache.store("empty", "");
  auto empty = cache.load("empty");
  REQUIRE(empty.has_value());
  CHECK(empty->empty());

  // Overwriting replaces the whole entry and leaves no temporary files behind.
  cache.store("fwd_sm80_fp16_d128-sm80-abc", "second");
  CHECK(cache.load("fwd_sm80_fp16_d128-sm80-abc") == std::optional<std::string>("second"));
  for (const auto& entry : fs::directory_iterator(cache.dir()))
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("kernel cache keys map to safe file names inside the directory", "[kernel_cache]") {
  flashgen::KernelCache cache("/tmp/flashgen-cache-names");
  CHECK(cache.path_for("fwd_sm80-sm90-0123abcd") ==
        fs::path("/tmp/flashgen-cache-names/fwd_sm80-sm90-0123abcd.cubin"));
  fs::path escaped = cache.path_for("../../etc/passwd");
  CHECK(escaped.parent_path() == cache.dir());
  CHECK(escaped.filename().string().find('/') == std::string::npos);
  CHECK(cache.path_for("a/b") != cache.path_for("a_b"));
}

TEST_CASE("content_hash is 32 lowercase hex chars and sensitive to every byte", "[kernel_cache]") {
  const std::string hash = flashgen::content_hash("flashgen");
  CHECK(hash.size() == 32);
  CHECK(hash.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(hash == flashgen::content_hash("flashgen"));
  CHECK(hash != flashgen::content_hash("flashgeN"));
  CHECK(flashgen::content_hash("") != flashgen::content_hash(std::string(1, '\0')));
  // The two halves use different seeds, so they differ from each other.
  CHECK(hash.substr(0, 16) != hash.substr(16));
}

TEST_CASE("kernel cache detects truncated and corrupted entries and rebuilds them", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  flashgen::KernelCache cache(temp.path());
  const std::string key = "fwd_sm80_bf16_d64-sm80-feed";
  const std::string payload = sample_payload();
  const fs::path path = cache.path_for(key);
  int produced = 0;
  auto produce = [&] {
    ++produced;
    return payload;
  };

  SECTION("truncated") {
    cache.store(key, payload);
    fs::resize_file(path, fs::file_size(path) - 100);
  }
  SECTION("truncated inside the header") {
    cache.store(key, payload);
    fs::resize_file(path, 20);
  }
  SECTION("one payload byte flipped") {
    cache.store(key, payload);
    std::string bytes = read_file(path);
    bytes[bytes.size() - 300] ^= 0x01;
    write_file(path, bytes);
  }
  SECTION("wrong magic") {
    cache.store(key, payload);
    std::string bytes = read_file(path);
    bytes[0] = 'X';
    write_file(path, bytes);
  }
  SECTION("a foreign file") {
    write_file(path, "not a cache entry");
  }

  const std::string damaged = read_file(path);
  CHECK_FALSE(cache.load(key).has_value());
  // load() reads without the entry's lock, so it never deletes: the file it judged damaged may already
  // have been replaced by a producer's good entry.
  CHECK(read_file(path) == damaged);

  // get_or_create replaces it, under the lock.
  bool hit = true;
  CHECK(cache.get_or_create(key, produce, &hit) == payload);
  CHECK_FALSE(hit);
  CHECK(produced == 1);
  CHECK(cache.load(key) == std::optional<std::string>(payload));
  CHECK(cache.get_or_create(key, produce, &hit) == payload);
  CHECK(hit);
  CHECK(produced == 1);
}

TEST_CASE("kernel cache drops a damaged entry under the lock even when rebuilding it fails", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  flashgen::KernelCache cache(temp.path());
  const std::string key = "fwd_sm80_fp16_d32-sm80-damaged";
  write_file(cache.path_for(key), "garbage");
  CHECK_THROWS_AS(cache.get_or_create(key, []() -> std::string { throw std::runtime_error("no compiler"); }),
                  std::runtime_error);
  CHECK_FALSE(fs::exists(cache.path_for(key)));
}

TEST_CASE("kernel cache in an unwritable directory works uncached and throws nothing", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  // A directory below a regular file can never be created, even by root (chmod would not stop root).
  write_file(temp.path() / "a-file", "x");
  flashgen::KernelCache cache(temp.path() / "a-file" / "cache");
  CHECK_NOTHROW(cache.store("key", "bytes"));
  CHECK_FALSE(cache.load("key").has_value());
  int produced = 0;
  bool hit = true;
  CHECK(cache.get_or_create("key", [&] { return std::to_string(++produced); }, &hit) == "1");
  CHECK_FALSE(hit);
  CHECK(cache.get_or_create("key", [&] { return std::to_string(++produced); }, &hit) == "2");
}

TEST_CASE("kernel cache propagates a failing produce and caches nothing", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  flashgen::KernelCache cache(temp.path());
  CHECK_THROWS_AS(cache.get_or_create("key", []() -> std::string { throw std::runtime_error("boom"); }),
                  std::runtime_error);
  CHECK_FALSE(cache.load("key").has_value());
  // The lock was released: the next call does not deadlock.
  CHECK(cache.get_or_create("key", [] { return std::string("ok"); }) == "ok");
}

TEST_CASE("kernel cache: concurrent processes produce one entry once", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  const fs::path counter = temp.path() / "produced.txt";
  const std::string key = "fwd_sm80_fp16_d128_m128_n64_w4_s2-sm80-race";
  constexpr int kChildren = 4;
  // Child exit codes: kProduced / kReadCached when its bytes equal the stored entry, else a failure code.
  constexpr int kProduced = 10;
  constexpr int kReadCached = 11;
  constexpr int kMismatch = 2;
  constexpr int kThrew = 3;

  int start[2];
  REQUIRE(::pipe(start) == 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kChildren; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: wait for the parent's go, race for the key, report through the exit status only.
      ::close(start[1]);
      char go = 0;
      while (::read(start[0], &go, 1) < 0 && errno == EINTR) {
      }
      int status = kThrew;
      try {
        flashgen::KernelCache cache(temp.path() / "cache");
        bool hit = false;
        std::string bytes = cache.get_or_create(
            key,
            [&] {
              std::string line = "produced by " + std::to_string(::getpid()) + "\n";
              int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
              if (fd >= 0) {
                ssize_t written = ::write(fd, line.data(), line.size());
                (void)written;
                ::close(fd);
              }
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              return "cubin from " + std::to_string(::getpid());
            },
            &hit);
        status = cache.load(key) == std::optional<std::string>(bytes) ? (hit ? kReadCached : kProduced)
                                                                      : kMismatch;
      } catch (...) {
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // EOF releases every child at once

  int produced = 0;
  int read_cached = 0;
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    INFO("child exit status " << WEXITSTATUS(status));
    CHECK((WEXITSTATUS(status) == kProduced || WEXITSTATUS(status) == kReadCached));
    produced += WEXITSTATUS(status) == kProduced;
    read_cached += WEXITSTATUS(status) == kReadCached;
  }
  CHECK(produced == 1);
  CHECK(read_cached == kChildren - 1);

  const std::string lines = read_file(counter);
  INFO("counter file:\n" << lines);
  REQUIRE(std::count(lines.begin(), lines.end(), '\n') == 1);
  // Every child compared its bytes with the entry; the entry is the one producer's output.
  const std::string producer_pid = lines.substr(lines.rfind(' ') + 1, lines.size() - lines.rfind(' ') - 2);
  flashgen::KernelCache cache(temp.path() / "cache");
  CHECK(cache.load(key) == std::optional<std::string>("cubin from " + producer_pid));
}

TEST_CASE("kernel cache without file locks stores whole entries and never loads a torn one", "[kernel_cache]") {
  TempDir temp{"flashgen-cache-test"};
  const FailingLocks no_locks;
  const fs::path dir = temp.path() / "cache";
  const std::string key = "fwd_sm80_fp16_d128_m128_n64_w4_s2-sm80-nolock";
  {
    // The lock is refused (the cache did ask for it), yet the entry is stored: the next call reads it.
    flashgen::KernelCache cache(dir);
    int produced = 0;
    bool hit = true;
    CHECK(cache.get_or_create(key, [&] { return std::to_string(++produced); }, &hit) == "1");
    CHECK_FALSE(hit);
    REQUIRE(no_locks.refused() > 0);
    CHECK(cache.get_or_create(key, [&] { return std::to_string(++produced); }, &hit) == "1");
    CHECK(hit);
    // A damaged entry is replaced whole, by rename, without the lock that guards its removal.
    write_file(cache.path_for(key), "garbage");
    CHECK(cache.get_or_create(key, [&] { return std::to_string(++produced); }, &hit) == "2");
    CHECK_FALSE(hit);
    CHECK(cache.load(key) == std::optional<std::string>("2"));
  }

  // Processes racing for a fresh key, each payload large enough that an unatomic write would be seen half done:
  // any may produce, and what each reads back is one producer's whole payload.
  const std::string race_key = key + "-race";
  constexpr int kChildren = 4;
  constexpr size_t kPayloadBytes = size_t{4} << 20;
  constexpr int kWhole = 10;
  int start[2];
  REQUIRE(::pipe(start) == 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kChildren; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(start[1]);
      char go = 0;
      while (::read(start[0], &go, 1) < 0 && errno == EINTR) {
      }
      int status = 1;
      try {
        flashgen::KernelCache cache(dir);
        const std::string mine(kPayloadBytes, static_cast<char>('a' + i));
        const std::string got = cache.get_or_create(race_key, [&] { return mine; });
        const std::optional<std::string> stored = cache.load(race_key);
        auto whole = [&](const std::string& bytes) {
          return bytes.size() == kPayloadBytes && bytes.find_first_not_of(bytes.front()) == std::string::npos;
        };
        if (whole(got) && stored && whole(*stored)) status = kWhole;
      } catch (...) {
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == kWhole);
  }
  flashgen::KernelCache cache(dir);
  const std::optional<std::string> entry = cache.load(race_key);
  REQUIRE(entry.has_value());
  CHECK(entry->size() == kPayloadBytes);
  for (const auto& file : fs::directory_iterator(dir))
    CHECK(file.path().filename().string().find(".tmp.") == std::string::npos);
}
