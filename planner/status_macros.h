// File: status_macros.h
// ZPLAN_RETURN_IF_ERROR / ZPLAN_ASSIGN_OR_RETURN for absl::Status and
// absl::StatusOr, and ZPLAN_CHECK for internal invariants.
//
// Abseil 20220623 (Debian 12) has neither status macros nor absl/log, so the
// project carries these thin versions. ZPLAN_CHECK is only for invariants
// whose failure means a bug in zplan itself; anything driven by input returns
// a Status instead.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(ModelSpec spec, LoadPreset(name));
//   ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(spec));
#ifndef ZPLAN_PLANNER_STATUS_MACROS_H_
#define ZPLAN_PLANNER_STATUS_MACROS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ZPLAN_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::absl::Status zplan_status_ = (expr);          \
    if (!zplan_status_.ok()) return zplan_status_;  \
  } while (0)

#define ZPLAN_STATUS_CONCAT_INNER_(a, b) a##b
#define ZPLAN_STATUS_CONCAT_(a, b) ZPLAN_STATUS_CONCAT_INNER_(a, b)

#define ZPLAN_ASSIGN_OR_RETURN(lhs, expr) \
  ZPLAN_ASSIGN_OR_RETURN_IMPL_(ZPLAN_STATUS_CONCAT_(zplan_statusor_, __LINE__), lhs, expr)

#define ZPLAN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

#define ZPLAN_CHECK(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                          \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

#endif  // ZPLAN_PLANNER_STATUS_MACROS_H_
