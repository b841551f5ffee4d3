// On-disk store of compiled kernels, shared by every process of a user or, on a shared filesystem, of a cluster.
// Entries are written atomically (temp file + rename), carry a checksum so truncation or corruption is detected and
// rebuilt, and a per-entry file lock makes concurrent processes compile one kernel once where flock works.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace flashgen {

class KernelCache {
 public:
  explicit KernelCache(std::filesystem::path dir);

  // $FLASHGEN_CACHE_DIR, else $XDG_CACHE_HOME/flashgen, else $HOME/.cache/flashgen.
  static std::filesystem::path default_dir();

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path_for(const std::string& key) const;

  // The stored bytes, or nullopt when missing, unreadable or damaged (truncated, corrupted, a foreign
  // file). Never deletes: a damaged entry is replaced by the next get_or_create, under the entry's lock.
  std::optional<std::string> load(const std::string& key) const;

  // Writes atomically; a failure to write (read-only disk, full disk) throws nothing and leaves no
  // partial file: the cache is an optimisation, never a reason to fail a call.
  void store(const std::string& key, const std::string& bytes) const;

  // Cached bytes for key, or produce() run while holding an exclusive lock on the key so another
  // process asking for the same key waits and then reads the stored result. *hit says which. Where no lock
  // can be had (a filesystem without flock, such as NFS without a lock daemon) produce() runs unlocked and
  // its result is stored all the same: racing processes may each produce it, and the entry is one whole copy.
  std::string get_or_create(const std::string& key, const std::function<std::string()>& produce,
                            bool* hit = nullptr) const;

 private:
  std::filesystem::path dir_;
};

// Hex digest (64-bit FNV-1a, twice with different seeds -> 32 hex chars) of a byte string.
std::string content_hash(const std::string& bytes);

}  // namespace flashgen
