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

void TranslateError(const percolite::Error& e) {
  const char* name = ErrorClassName(e.code());
  if (name == nullptr) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return;
  }
  py::object cls = py::module_::import("percolite.errors").attr(name);
  PyErr_SetString(cls.ptr(), e.what());
}

}  // namespace percolite::bindings
