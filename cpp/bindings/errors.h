// Core errors as Python exceptions.
#pragma once

#include <pybind11/pybind11.h>

#include "percolite/status.h"

namespace percolite::bindings {

// The one table from core error codes to Python exception classes
// (python/percolite/errors.py defines the classes): a class name, or nullptr
// for ValueError.
const char* ErrorClassName(percolite::ErrorCode code);

// Sets the Python error for `e`, as the module's exception translator does.
void TranslateError(const percolite::Error& e);

// The Python exception object for a failed status (GIL held).
pybind11::object ExceptionFor(const percolite::Status& status);

}  // namespace percolite::bindings
