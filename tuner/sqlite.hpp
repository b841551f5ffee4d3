// A thin C++ layer over the SQLite C API: an owning connection, prepared statements, transactions and
// the one throwing check for SQLite calls. Knows nothing of flashgen's tables; the tuning store uses it.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>

// Throws Error(kInternal) with file:line, the call and SQLite's own text unless the call returns SQLITE_OK.
#define FLASHGEN_SQLITE_CHECK(db, call_expr)                                                      \
  do {                                                                                            \
    const int flashgen_sqlite_rc_ = (call_expr);                                                  \
    if (flashgen_sqlite_rc_ != SQLITE_OK)                                                         \
      ::flashgen::sqlite::throw_error((db), flashgen_sqlite_rc_, #call_expr, __FILE__, __LINE__); \
  } while (0)

namespace flashgen::sqlite {

// Error text of a failed SQLite call: "file:line: call failed (rc): sqlite3_errmsg" (sqlite3_errstr when
// there is no connection). The macro and the few checks that accept other codes use it.
[[noreturn]] void throw_error(sqlite3* db, int rc, const char* call, const char* file, int line);

struct ConnectionCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Connection = std::unique_ptr<sqlite3, ConnectionCloser>;

// One prepared statement; bind_* take 1-based indices, column readers 0-based ones.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind_text(int index, const std::string& value);
  Statement& bind_int(int index, int64_t value);
  Statement& bind_real(int index, double value);

  // True when a row is ready, false when the statement is done; an error names the statement.
  bool step();
  // Steps a statement that returns no rows and resets it so it can be bound and run again.
  void run();

  std::string text(int column) const;
  int64_t integer(int column) const;
  double real(int column) const;
  bool is_null(int column) const;  // the column holds SQL NULL

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Runs SQL without results; the error names the statement.
void exec(sqlite3* db, const std::string& sql);

// BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy timeout), so a writer never
// fails halfway through with SQLITE_BUSY on a lock upgrade. Rolled back unless commit() is reached.
class Transaction {
 public:
  explicit Transaction(sqlite3* db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  sqlite3* db_;
  bool committed_ = false;
};

// PRAGMA user_version: 0 for a new file.
int user_version(sqlite3* db);

}  // namespace flashgen::sqlite
