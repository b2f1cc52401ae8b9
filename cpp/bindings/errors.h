// Core errors as Python exceptions.
#pragma once

#include "percolite/status.h"

namespace percolite::bindings {

// The one table from core error codes to Python exception classes
// (python/percolite/errors.py defines the classes): a class name, or nullptr
// for ValueError.
const char* ErrorClassName(percolite::ErrorCode code);

// Sets the Python error for `e`, as the module's exception translator does.
void TranslateError(const percolite::Error& e);

}  // namespace percolite::bindings
