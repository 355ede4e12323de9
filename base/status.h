// Status plumbing shared by every layer above the compute code.
//
// The error rule (docs/contributing.md, "Errors"): the libtorch compute code
// (model/, dist/'s c10d wrappers, learner/algo/) reports bad input and broken invariants by
// throwing (std::invalid_argument for input, other std::exception types,
// c10::Error included, for the rest); everything above returns absl::Status.
// CaptureExceptions is where one becomes the other: a service-layer call into
// the compute code goes through it, and nothing else in the service layer
// catches.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define KAPPA_RETURN_IF_ERROR(expr)                                 \
  do {                                                              \
    if (absl::Status kappa_status_ = (expr); !kappa_status_.ok()) { \
      return kappa_status_;                                         \
    }                                                               \
  } while (false)

#define KAPPA_STATUS_CONCAT_INNER_(a, b) a##b
#define KAPPA_STATUS_CONCAT_(a, b) KAPPA_STATUS_CONCAT_INNER_(a, b)

// `lhs` = the value of `rexpr` (an absl::StatusOr<T>), or returns its status
// from the enclosing function. `lhs` may declare: KAPPA_ASSIGN_OR_RETURN(auto x, F());
#define KAPPA_ASSIGN_OR_RETURN(lhs, rexpr) \
  KAPPA_ASSIGN_OR_RETURN_IMPL_(KAPPA_STATUS_CONCAT_(kappa_statusor_, __LINE__), lhs, rexpr)
#define KAPPA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

namespace kappa::base {

// `context: what()` with the code the exception's type stands for:
// std::invalid_argument → INVALID_ARGUMENT, std::out_of_range → OUT_OF_RANGE,
// anything else → `otherwise` (INTERNAL unless the caller knows better).
inline absl::Status StatusFromException(const std::exception& e, absl::string_view context,
                                        absl::StatusCode otherwise = absl::StatusCode::kInternal) {
  absl::StatusCode code = otherwise;
  if (dynamic_cast<const std::invalid_argument*>(&e) != nullptr) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (dynamic_cast<const std::out_of_range*>(&e) != nullptr) {
    code = absl::StatusCode::kOutOfRange;
  }
  return absl::Status(
      code, context.empty() ? std::string(e.what()) : absl::StrCat(context, ": ", e.what()));
}

// Calls `f()`; an exception it throws comes back as StatusFromException's
// status. absl::Status for a void `f`, else absl::StatusOr of its result.
template <typename F>
auto CaptureExceptions(absl::string_view context, F&& f,
                       absl::StatusCode otherwise = absl::StatusCode::kInternal)
    -> std::conditional_t<std::is_void_v<std::invoke_result_t<F&>>, absl::Status,
                          absl::StatusOr<std::invoke_result_t<F&>>> {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      return absl::OkStatus();
    } else {
      return f();
    }
  } catch (const std::exception& e) {
    return StatusFromException(e, context, otherwise);
  }
}

}  // namespace kappa::base
