// What the Python module's files share: kreg's errors as Python's (ValueError
// for bad arguments, OSError/FileNotFoundError for files, MemoryError,
// NotImplementedError, RuntimeError for what failed at run time), and
// numbers from Python checked by kreg/limits.h's checks.
#ifndef KREG_PYTHON_ERRORS_H_
#define KREG_PYTHON_ERRORS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kreg/limits.h"

namespace kreg::python {

namespace py = pybind11;

// What kind of Python error a kreg status is: the one mapping behind Throw
// and the C bridge's codes (module.cc, bridge.h).
enum class ErrorKind { kValue, kMemory, kNotImplemented, kRuntime };

inline ErrorKind KindOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kNotFound:  // an unknown kernel, op or name
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return ErrorKind::kValue;
    case absl::StatusCode::kResourceExhausted:
      return ErrorKind::kMemory;
    case absl::StatusCode::kUnimplemented:
      return ErrorKind::kNotImplemented;
    default:
      return ErrorKind::kRuntime;
  }
}

[[noreturn]] inline void Throw(const absl::Status& status) {
  const std::string message(status.message());
  switch (KindOf(status.code())) {
    case ErrorKind::kValue:
      throw py::value_error(message);
    case ErrorKind::kMemory:
      PyErr_SetString(PyExc_MemoryError, message.c_str());
      throw py::error_already_set();
    case ErrorKind::kNotImplemented:
      PyErr_SetString(PyExc_NotImplementedError, message.c_str());
      throw py::error_already_set();
    case ErrorKind::kRuntime:
      break;
  }
  throw std::runtime_error(message);
}

// A file's error: FileNotFoundError when it is missing, OSError when it is
// unreadable or not a table.
[[noreturn]] inline void ThrowFile(const absl::Status& status) {
  PyObject* type = status.code() == absl::StatusCode::kNotFound ? PyExc_FileNotFoundError : PyExc_OSError;
  PyErr_SetString(type, std::string(status.message()).c_str());
  throw py::error_already_set();
}

template <typename T>
T Value(absl::StatusOr<T> s) {
  if (!s.ok()) Throw(s.status());
  return *std::move(s);
}

inline void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}

// An integer argument from Python, of any size, checked by one of
// kreg/limits.h's checks: TypeError for what is not an integer, ValueError
// (the check's line, quoting the number as given) for one out of bounds.
inline int64_t Checked(const py::handle& value, const char* name, const std::function<absl::Status(int64_t)>& check) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
    throw py::type_error(absl::StrCat(name, ": expected an integer, got ", py::str(py::type::of(value)).cast<std::string>()));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  const int64_t clamped = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : v;
  absl::Status s = check(clamped);
  if (s.ok()) return clamped;
  std::string message(s.message());
  if (overflow != 0) message = absl::StrCat(message.substr(0, message.rfind(", got ")), ", got ", py::str(value).cast<std::string>());
  throw py::value_error(message);
}

// A thread count as the command line takes it.
inline int Threads(const py::handle& threads) {
  return static_cast<int>(Checked(threads, "threads", [](int64_t v) { return limits::CheckThreads(v); }));
}

}  // namespace kreg::python

#endif  // KREG_PYTHON_ERRORS_H_
