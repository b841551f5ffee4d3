// On-disk kernel cache: checksummed entries written with temp file + fsync + rename, and a flock per key
// so concurrent processes (and threads) produce each entry once where locks work. Every I/O failure degrades to a
// miss; a lock that cannot be had (NFS without a lock daemon) only costs duplicate compiles, never a torn entry.
#include "runtime/kernel_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "flashgen/error.hpp"

namespace flashgen {
namespace {

// Entry layout: magic (8) | payload length, little-endian u64 (8) | content_hash(payload) (32) | payload.
constexpr char kMagic[] = "FLGNCCH1";
constexpr size_t kMagicBytes = 8;
constexpr size_t kLengthBytes = 8;
constexpr size_t kHashBytes = 32;
constexpr size_t kHeaderBytes = kMagicBytes + kLengthBytes + kHashBytes;

constexpr uint64_t kFnvPrime = 0x100000001b3ULL;
constexpr uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ULL;         // the standard FNV-1a seed
constexpr uint64_t kFnvSecondOffsetBasis = 0x6c62272e07bb0142ULL;   // FNV-1a of a different seed

uint64_t fnv1a(const std::string& bytes, uint64_t hash) {
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= kFnvPrime;
  }
  return hash;
}

void append_hex(uint64_t value, std::string* out) {
  static const char kDigits[] = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4) out->push_back(kDigits[(value >> shift) & 0xf]);
}

std::string encode_length(uint64_t length) {
  std::string bytes(kLengthBytes, '\0');
  for (size_t i = 0; i < kLengthBytes; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes;
}

uint64_t decode_length(const char* bytes) {
  uint64_t length = 0;
  for (size_t i = 0; i < kLengthBytes; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return length;
}

bool is_filename_safe(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

// Unique among processes (pid) and threads and calls (random + counter) sharing one cache directory.
std::string temp_suffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 random(
      std::random_device{}() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::string suffix = ".tmp." + std::to_string(::getpid()) + ".";
  append_hex(random() ^ counter.fetch_add(1), &suffix);
  return suffix;
}

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

// One read of an entry file: its payload when intact, and which file (device, inode) was read, so a
// damaged one is removed only if the path still names it.
struct EntryRead {
  enum class State { kMissing, kIntact, kDamaged };
  State state = State::kMissing;
  std::string payload;
  dev_t device = 0;
  ino_t inode = 0;
};

EntryRead read_entry(const std::filesystem::path& path) {
  EntryRead entry;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return entry;
  std::string file;
  struct stat info {};
  bool ok = ::fstat(fd, &info) == 0;
  if (ok) file.reserve(static_cast<size_t>(info.st_size));
  char buffer[1 << 16];
  while (ok) {
    ssize_t count = ::read(fd, buffer, sizeof(buffer));
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) {
      ok = count == 0;
      break;
    }
    file.append(buffer, static_cast<size_t>(count));
  }
  ::close(fd);
  if (!ok) return entry;  // an unreadable entry is a miss, not proof of damage
  entry.device = info.st_dev;
  entry.inode = info.st_ino;
  entry.state = EntryRead::State::kDamaged;
  const bool framed = file.size() >= kHeaderBytes && file.compare(0, kMagicBytes, kMagic, kMagicBytes) == 0 &&
                      decode_length(file.data() + kMagicBytes) == file.size() - kHeaderBytes;
  if (!framed) return entry;
  std::string payload = file.substr(kHeaderBytes);
  if (file.compare(kMagicBytes + kLengthBytes, kHashBytes, content_hash(payload)) != 0) return entry;
  entry.state = EntryRead::State::kIntact;
  entry.payload = std::move(payload);
  return entry;
}

// Holds an exclusive flock on "<entry>.lock" for its lifetime; locked() is false when there is no lock to be had:
// the lock file cannot be opened (read-only or missing directory), the filesystem refuses flock (ENOLCK on NFS
// without a lock daemon, ENOSYS or EOPNOTSUPP on Lustre and some FUSE mounts), or another holder keeps it past
// kLockWait (a stopped or hung process). A lock file another user made (mode 0644) is opened read-only: flock works
// on any descriptor.
class EntryLock {
 public:
  static constexpr std::chrono::seconds kLockWait{300};

  explicit EntryLock(const std::filesystem::path& lock_path) {
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fd_ = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;
    const auto deadline = std::chrono::steady_clock::now() + kLockWait;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() > deadline) {
        if (errno == EWOULDBLOCK) {
          std::fprintf(stderr, "flashgen: warning: %s held for over %lld s; compiling without waiting for it\n",
                       lock_path.c_str(), static_cast<long long>(kLockWait.count()));
        }
        ::close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~EntryLock() {
    if (fd_ < 0) return;
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;

  bool locked() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace

std::string content_hash(const std::string& bytes) {
  std::string hex;
  hex.reserve(kHashBytes);
  append_hex(fnv1a(bytes, kFnvOffsetBasis), &hex);
  append_hex(fnv1a(bytes, kFnvSecondOffsetBasis), &hex);
  return hex;
}

KernelCache::KernelCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

std::filesystem::path KernelCache::default_dir() {
  const char* explicit_dir = std::getenv("FLASHGEN_CACHE_DIR");
  if (explicit_dir != nullptr && explicit_dir[0] != '\0') return explicit_dir;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] != '\0') return std::filesystem::path(xdg) / "flashgen";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return std::filesystem::path(home) / ".cache" / "flashgen";
  // No home (some daemons and containers): a per-user folder under the temp directory, made 0700. Its name
  // is predictable, so it is used only if it is this user's real directory, writable by nobody else: cubins
  // found there are loaded and run. Otherwise this process gets a fresh private folder of its own.
  std::error_code ignored;
  const std::filesystem::path temp = std::filesystem::temp_directory_path(ignored);
  const std::string name = "flashgen-cache-" + std::to_string(::getuid());
  const std::filesystem::path shared = temp / name;
  ::mkdir(shared.c_str(), 0700);  // EEXIST: checked below like any existing folder
  struct stat st {};
  if (::lstat(shared.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid() &&
      (st.st_mode & (S_IWGRP | S_IWOTH)) == 0) {
    return shared;
  }
  std::string pattern = (temp / (name + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) return temp / (name + "-unusable") / "none";  // stores fail: uncached
  return pattern;
}

std::filesystem::path KernelCache::path_for(const std::string& key) const {
  FLASHGEN_REQUIRE(!key.empty(), "kernel cache key is empty");
  std::string name;
  name.reserve(key.size());
  bool replaced = false;
  for (char c : key) {
    replaced |= !is_filename_safe(c);
    name.push_back(is_filename_safe(c) ? c : '_');
  }
  // Replacing characters could make two keys share a file; the hash of the original keeps them apart.
  if (replaced) name += "-" + content_hash(key).substr(0, 16);
  return dir_ / (name + ".cubin");
}

std::optional<std::string> KernelCache::load(const std::string& key) const {
  EntryRead entry = read_entry(path_for(key));
  if (entry.state != EntryRead::State::kIntact) return std::nullopt;
  return std::move(entry.payload);
}

void KernelCache::store(const std::string& key, const std::string& bytes) const {
  const std::filesystem::path path = path_for(key);
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error) return;

  const std::string temp = path.string() + temp_suffix();
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string header(kMagic, kMagicBytes);
  header += encode_length(bytes.size());
  header += content_hash(bytes);
  bool ok = write_all(fd, header.data(), header.size()) && write_all(fd, bytes.data(), bytes.size()) &&
            ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  // rename() replaces the final path atomically: readers see the old entry or the whole new one.
  if (!ok || ::rename(temp.c_str(), path.c_str()) != 0) ::unlink(temp.c_str());
}

std::string KernelCache::get_or_create(const std::string& key, const std::function<std::string()>& produce,
                                       bool* hit) const {
  if (hit != nullptr) *hit = false;
  if (std::optional<std::string> cached = load(key)) {
    if (hit != nullptr) *hit = true;
    return *cached;
  }

  std::error_code ignored;
  std::filesystem::create_directories(dir_, ignored);
  EntryLock lock(path_for(key).string() + ".lock");
  if (!lock.locked()) {
    // No coordination: another process may be producing the same entry, and each stores its own whole copy
    // (rename replaces the path atomically, a damaged entry included). In a read-only cache the store just fails.
    std::string bytes = produce();
    store(key, bytes);
    return bytes;
  }

  // Whoever held the lock before us may have just stored the entry.
  const std::filesystem::path path = path_for(key);
  EntryRead entry = read_entry(path);
  if (entry.state == EntryRead::State::kIntact) {
    if (hit != nullptr) *hit = true;
    return std::move(entry.payload);
  }
  if (entry.state == EntryRead::State::kDamaged) {
    // Truncated or corrupted (crash mid-write on a filesystem without rename atomicity, disk error, a
    // foreign file): drop it, so it goes even if the store below fails. Only here, under the lock, and
    // only if the path still names the file that was read: a reader without the lock could otherwise
    // delete the good entry a producer had just renamed into place.
    struct stat now {};
    if (::stat(path.c_str(), &now) == 0 && now.st_dev == entry.device && now.st_ino == entry.inode)
      ::unlink(path.c_str());
  }
  std::string bytes = produce();
  store(key, bytes);
  return bytes;
}

}  // namespace flashgen
