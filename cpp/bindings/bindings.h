// percolite._core: the thin pybind11 layer over the core.
//
// Rules: arguments are converted while the GIL is held;
// every call into the core that can block (LMDB work, commit, waiting, worker
// start and stop, store locks) runs with the GIL released; core errors become
// Python exceptions through ErrorClassName, the one translation table.
//
// Calls that only touch a transaction's in-memory state (set, delete,
// set_weak_notification, state, commit_ts) keep the GIL: they take only the
// transaction's own mutex, whose holders never wait for the GIL, so this
// cannot deadlock; and releasing the GIL four times per transaction made
// 16 committing threads hand the GIL around instead of filling group commits.
//
// Files: module.cc makes the module (constants, error translation, the Bind
// calls); one file binds each class; convert, errors, callables and codecs
// hold what those share.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "percolite/env.h"
#include "percolite/transaction.h"

namespace py = pybind11;

namespace percolite::bindings {

using Tx = percolite::Transaction;

// Owns an Env for Python; destroying it releases the GIL first, because
// closing drains work that may be waiting for the GIL.
struct PyEnv {
  std::shared_ptr<percolite::Env> env;
  ~PyEnv() {
    if (env && Py_IsInitialized()) {
      py::gil_scoped_release release;
      env.reset();
    }
  }
};

// Each binds one class into the module.
void BindEnv(py::module_& m);
void BindCombineQueue(py::module_& m);
void BindExportQueue(py::module_& m);
void BindLoader(py::module_& m);
void BindTransaction(py::module_& m);

}  // namespace percolite::bindings
