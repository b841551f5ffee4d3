// The thin SQLite layer (see sqlite.hpp): statements, transactions and the error text of failed calls,
// which names the call or the statement and carries sqlite3_errmsg.
#include "tuner/sqlite.hpp"

#include <algorithm>
#include <cstddef>

#include "flashgen/error.hpp"

namespace flashgen::sqlite {
namespace {

// The first line of a statement, for error messages: enough to tell which one failed.
std::string sql_excerpt(const char* sql) {
  std::string text = sql != nullptr ? sql : "";
  const size_t start = text.find_first_not_of(" \n");
  if (start == std::string::npos) return "";
  text = text.substr(start);
  return text.substr(0, std::min(text.find('\n'), size_t{80}));
}

}  // namespace

void throw_error(sqlite3* db, int rc, const char* call, const char* file, int line) {
  const std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  fail(Status::kInternal, std::string(file) + ":" + std::to_string(line) + ": " + call + " failed (" +
                              std::to_string(rc) + "): " + message);
}

Statement::Statement(sqlite3* db, const std::string& sql) : db_(db) {
  FLASHGEN_SQLITE_CHECK(db_, sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt_, nullptr));
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::bind_text(int index, const std::string& value) {
  FLASHGEN_SQLITE_CHECK(db_, sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                                               SQLITE_TRANSIENT));
  return *this;
}

Statement& Statement::bind_int(int index, int64_t value) {
  FLASHGEN_SQLITE_CHECK(db_, sqlite3_bind_int64(stmt_, index, value));
  return *this;
}

Statement& Statement::bind_real(int index, double value) {
  FLASHGEN_SQLITE_CHECK(db_, sqlite3_bind_double(stmt_, index, value));
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw_error(db_, rc, ("sqlite3_step(\"" + sql_excerpt(sqlite3_sql(stmt_)) + "\")").c_str(), __FILE__, __LINE__);
}

void Statement::run() {
  while (step()) {
  }
  sqlite3_reset(stmt_);
}

std::string Statement::text(int column) const {
  const auto* bytes = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
  return bytes != nullptr ? std::string(bytes, static_cast<size_t>(sqlite3_column_bytes(stmt_, column)))
                          : std::string();
}

int64_t Statement::integer(int column) const { return sqlite3_column_int64(stmt_, column); }

double Statement::real(int column) const { return sqlite3_column_double(stmt_, column); }

bool Statement::is_null(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }

void exec(sqlite3* db, const std::string& sql) {
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK)
    throw_error(db, rc, ("sqlite3_exec(\"" + sql_excerpt(sql.c_str()) + "\")").c_str(), __FILE__, __LINE__);
}

Transaction::Transaction(sqlite3* db) : db_(db) { exec(db_, "BEGIN IMMEDIATE"); }

Transaction::~Transaction() {
  if (!committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  exec(db_, "COMMIT");
  committed_ = true;
}

int user_version(sqlite3* db) {
  Statement statement(db, "PRAGMA user_version");
  return statement.step() ? static_cast<int>(statement.integer(0)) : 0;
}

}  // namespace flashgen::sqlite
