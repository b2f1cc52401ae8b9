// Python callables that core threads (workers, queue processors) call.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>

#include "percolite/combine_queue.h"
#include "percolite/export_queue.h"
#include "percolite/notifications.h"
#include "percolite/status.h"

namespace py = pybind11;

namespace percolite::bindings {

bool InterpreterFinalizing();

// A Python callable held by C++ threads: copied only as a shared_ptr, and
// released with the GIL held.
struct PyCallable {
  py::object fn;
  explicit PyCallable(py::object f) : fn(std::move(f)) {}
  ~PyCallable();
};

// Python runners (python/percolite/_app.py, _combine.py) report a failure by
// returning (False, traceback) instead of raising, so the traceback is
// formatted once, in Python; (True, result) is a success. An exporter's
// runner returns (False, traceback, "down") when the sink is down (a
// transient error: kSinkUnavailable) and (False, traceback, "refused") when
// it refuses for good (kSinkRefused); None there is an ordinary failure.
percolite::Status RunnerStatus(const py::tuple& outcome);

// Calls into Python from a core thread: takes the GIL for the call only, and
// turns an exiting interpreter or a Python exception into a kCallback status.
template <typename Call>
percolite::Status CallPython(Call&& call) {
  if (!Py_IsInitialized() || InterpreterFinalizing()) {
    return percolite::Status::Make(ErrorCode::kCallback, "the Python interpreter is exiting");
  }
  py::gil_scoped_acquire gil;
  try {
    return call();
  } catch (py::error_already_set& e) {
    return percolite::Status::Make(ErrorCode::kCallback, e.what());
  }
}

// An observer: runner(core_tx, row, family, qualifier) -> (ok, traceback).
percolite::ObserverFn MakeObserverFn(py::object runner);

// A combiner: runner(key, [values]) -> (True, value | None) or (False, traceback).
percolite::CombineFn MakeCombineFn(py::object runner);

// A change observer: runner(core_tx, [(key, old, new)]) -> (ok, traceback).
percolite::ChangeFn MakeChangeFn(py::object runner);

// An exporter: runner([(key, value, seq)], store_id, epoch) -> (ok,
// traceback, sink failure), with the raw queued bytes. With both codecs
// native, runner gets decoded entries instead: [entry_type(key, value or
// None, seq)]. store_id and epoch name the store (identity.h).
percolite::ExportFn MakeExportFn(py::object runner, py::object entry_type, py::object key_codec,
                                 py::object value_codec);

}  // namespace percolite::bindings
