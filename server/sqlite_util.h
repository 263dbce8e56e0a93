// Small RAII helpers over SQLite's C API, shared by the job store and the access store: a
// prepared statement finalized when it goes out of scope, and a transaction rolled back unless
// committed.
#ifndef STOKER_SERVER_SQLITE_UTIL_H_
#define STOKER_SERVER_SQLITE_UTIL_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

namespace stoker {

class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  // sqlite3_step's result: SQLITE_ROW, SQLITE_DONE or an error.
  int Step() { return sqlite3_step(stmt_); }
  void BindText(int index, const std::string& text) {
    sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int index, const std::string& bytes) {
    sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  }
  void BindInt(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  std::string ColumnBlob(int column) {
    const void* data = sqlite3_column_blob(stmt_, column);
    return std::string(static_cast<const char*>(data), sqlite3_column_bytes(stmt_, column));
  }
  std::string ColumnText(int column) {
    const unsigned char* text = sqlite3_column_text(stmt_, column);
    return text == nullptr ? std::string()
                           : std::string(reinterpret_cast<const char*>(text),
                                         sqlite3_column_bytes(stmt_, column));
  }
  int64_t ColumnInt(int column) { return sqlite3_column_int64(stmt_, column); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// BEGIN IMMEDIATE on construction; rolls back unless Commit() succeeded.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {
    began_ = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  ~Transaction() {
    if (began_ && !committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  bool began() const { return began_; }
  bool Commit() {
    committed_ = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK;
    return committed_;
  }

 private:
  sqlite3* db_;
  bool began_ = false;
  bool committed_ = false;
};

}  // namespace stoker

#endif  // STOKER_SERVER_SQLITE_UTIL_H_
