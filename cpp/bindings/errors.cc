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
    case ErrorCode::kSinkUnavailable:
    case ErrorCode::kSinkRefused:
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

namespace {
// A message may quote bytes read from a damaged store: decoded leniently, so
// that a bad byte shows as an escape instead of raising UnicodeDecodeError.
py::str MessageText(const std::string& message) {
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()),
                                        "backslashreplace");
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}
}  // namespace

void TranslateError(const percolite::Error& e) {
  PyErr_SetObject(ClassFor(e.code()).ptr(), MessageText(e.what()).ptr());
}

py::object ExceptionFor(const percolite::Status& status) {
  return ClassFor(status.code())(MessageText(status.message()));
}

}  // namespace percolite::bindings
