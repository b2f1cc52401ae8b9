#include "errors.h"

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace percolite::bindings {

const char* ErrorClassName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kConflict:
      return "CommitConflict";
    case ErrorCode::kClosed:
      return "ClosedError";
    case ErrorCode::kCorruption:
      return "CorruptionError";
    case ErrorCode::kStorage:
      return "StorageError";
    case ErrorCode::kCallback:
      return "CallbackError";
    case ErrorCode::kInvalidArgument:
      return nullptr;  // ValueError
    case ErrorCode::kWrongState:
    case ErrorCode::kOk:
      return "Error";
  }
  return "Error";
}

namespace {
py::object ClassFor(ErrorCode code) {
  const char* name = ErrorClassName(code);
  if (name == nullptr) return py::reinterpret_borrow<py::object>(PyExc_ValueError);
  return py::module_::import("percolite.errors").attr(name);
}
}  // namespace

void TranslateError(const percolite::Error& e) {
  PyErr_SetString(ClassFor(e.code()).ptr(), e.what());
}

py::object ExceptionFor(const percolite::Status& status) {
  return ClassFor(status.code())(status.message());
}

}  // namespace percolite::bindings
