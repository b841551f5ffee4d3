// The tuning database's file format: the schema and its migrations, and the checks that tell a sound
// flashgen database from a damaged file or another program's before TuningStore uses it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "tuner/sqlite.hpp"

namespace flashgen {

// Opens path with SQLITE_OPEN_* flags, a busy timeout for other processes' transactions and extended
// result codes. Throws Error(kInvalidArgument) when the path cannot be opened (no such folder, no
// permission), Error(kInternal) for other SQLite failures.
sqlite::Connection open_tuning_database(const std::filesystem::path& path, int flags);

// Checks and prepares a read-write connection: damage, schema version, WAL, foreign keys, migration.
// Returns why the file is damaged or not a flashgen database, or nullopt when the connection is ready;
// throws Error(kUnsupported) for a newer schema.
std::optional<std::string> prepare_read_write(sqlite3* db, const std::filesystem::path& path);

// Why an open file cannot be used as a flashgen database as it is: damaged, or another program's
// database (version 0 but holding tables); nullopt otherwise.
std::optional<std::string> unusable_reason(sqlite3* db);

// Throws Error(kUnsupported): the file at path has a schema version newer than TuningStore::kSchemaVersion.
[[noreturn]] void throw_newer_version(const std::filesystem::path& path, int version);

}  // namespace flashgen
