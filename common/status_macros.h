// Early returns for absl::Status and absl::StatusOr, so a chain of fallible calls reads as the
// steps it takes. Both work in functions that return absl::Status or any absl::StatusOr<T>.
//
//   STOKER_RETURN_IF_ERROR(store.Save(job));
//   STOKER_ASSIGN_OR_RETURN(const DatasetSummary summary, ProbeDatasetFiles(files, limit));
#ifndef STOKER_COMMON_STATUS_MACROS_H_
#define STOKER_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status of `expr` (an absl::Status) from the enclosing function unless it is OK.
#define STOKER_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                     \
    if (absl::Status stoker_status_ = (expr); !stoker_status_.ok()) return stoker_status_; \
  } while (0)

// Evaluates `expr` (an absl::StatusOr<T>); returns its status unless it is OK, else moves its
// value into `lhs`, which may declare a variable ("const T name"). One use per line.
#define STOKER_ASSIGN_OR_RETURN(lhs, expr) \
  STOKER_ASSIGN_OR_RETURN_IMPL_(STOKER_STATUS_CONCAT_(stoker_statusor_, __LINE__), lhs, expr)

#define STOKER_STATUS_CONCAT_INNER_(a, b) a##b
#define STOKER_STATUS_CONCAT_(a, b) STOKER_STATUS_CONCAT_INNER_(a, b)
#define STOKER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#endif  // STOKER_COMMON_STATUS_MACROS_H_
