// Hand-crafting and inspecting tuning database files in tests: the SQLite C API through the copy that
// libflashgen already loaded (the test target links only flashgen, which keeps SQLite private).
#pragma once

#include <dlfcn.h>
#include <sqlite3.h>

#include <filesystem>
#include <string>
#include <vector>

#include "catch.hpp"

namespace flashgen::testing {

// The SQLite C API, looked up at run time from the copy libflashgen already loaded: the test target
// links only flashgen, which keeps SQLite private. Used to inspect and hand-craft database files.
class RawSqlite {
 public:
  explicit RawSqlite(const std::filesystem::path& path) {
    REQUIRE(api().open_v2 != nullptr);
    REQUIRE(api().open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) == SQLITE_OK);
  }
  ~RawSqlite() { api().close(db_); }
  RawSqlite(const RawSqlite&) = delete;
  RawSqlite& operator=(const RawSqlite&) = delete;

  void exec(const std::string& sql) {
    char* error = nullptr;
    const int rc = api().exec(db_, sql.c_str(), nullptr, nullptr, &error);
    INFO(sql << ": " << (error != nullptr ? error : ""));
    api().free(error);
    REQUIRE(rc == SQLITE_OK);
  }
  // Every row's first column.
  std::vector<std::string> column(const std::string& sql) {
    std::vector<std::string> rows;
    auto collect = [](void* out, int, char** values, char**) {
      static_cast<std::vector<std::string>*>(out)->push_back(values[0] != nullptr ? values[0] : "");
      return 0;
    };
    REQUIRE(api().exec(db_, sql.c_str(), collect, &rows, nullptr) == SQLITE_OK);
    return rows;
  }

 private:
  struct Api {
    decltype(&sqlite3_open_v2) open_v2 = nullptr;
    decltype(&sqlite3_exec) exec = nullptr;
    decltype(&sqlite3_close) close = nullptr;
    decltype(&sqlite3_free) free = nullptr;
  };
  static const Api& api() {
    static const Api loaded = [] {
      void* library = dlopen("libsqlite3.so.0", RTLD_NOW | RTLD_NOLOAD);
      if (library == nullptr) library = dlopen("libsqlite3.so.0", RTLD_NOW);
      Api a;
      if (library == nullptr) return a;
      a.open_v2 = reinterpret_cast<decltype(a.open_v2)>(dlsym(library, "sqlite3_open_v2"));
      a.exec = reinterpret_cast<decltype(a.exec)>(dlsym(library, "sqlite3_exec"));
      a.close = reinterpret_cast<decltype(a.close)>(dlsym(library, "sqlite3_close"));
      a.free = reinterpret_cast<decltype(a.free)>(dlsym(library, "sqlite3_free"));
      return a;
    }();
    return loaded;
  }
  sqlite3* db_ = nullptr;
};

}  // namespace flashgen::testing
