// Arguments from Python to the core and results back, with the GIL held.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>

#include "percolite/backend.h"
#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/failures.h"
#include "percolite/leases.h"
#include "percolite/workers.h"

namespace py = pybind11;

namespace percolite::bindings {

std::string TypeName(py::handle h);

// bytes, bytearray and memoryview are taken as they are; str means UTF-8.
// `what` names the argument in the TypeError.
std::string ToBytes(py::handle h, const char* what);

struct CellArg {
  std::string row, family, qualifier;
  percolite::CellRef ref() const { return {row, family, qualifier}; }
};

// A (family, qualifier) tuple.
std::pair<std::string, std::string> ToColumn(py::handle column);

CellArg ToCell(py::handle row, py::handle column);

// Views of a cell's parts without copying them, valid while the arguments
// live: true when row is bytes or str and column a 2-tuple of those (any
// other type, or undecodable text, is left for ToCell to name).
bool CellViews(PyObject* row, PyObject* column, percolite::CellRef* out);

py::object OptionalBytes(const std::optional<std::string>& value);

percolite::SyncMode ParseSync(const std::string& sync);
percolite::NativeCombiner ParseCombiner(const std::string& name);
percolite::ValueType ParseValueType(const std::string& name);

py::dict ObserverStatsToDict(const percolite::ObserverStats& s);
// {"observer", "row", "family", "qualifier", "key" (a queue key, or None), "attempts", "parked",
//  "first_failure_unix", "last_failure_unix", "error": {"type", "message", "traceback"}}
py::dict WorkRecordToDict(const percolite::WorkRecord& r);
// {"observer", "failures", "parked", "first_failure_unix", "last_failure_unix",
//  "last_cell": {"row", "family", "qualifier"}, "last_error": {...}}
py::dict FailureSummaryToDict(const percolite::FailureSummary& s);
// {"owner", "group", "threads", "expires_unix", "live", "partitions"}
py::dict LeaseHolderToDict(const percolite::LeaseHolder& h);

// Calls get() with the GIL released (it reads the store), then, with the GIL
// held again, makes a list of convert(item) for each item it returned.
template <typename Get, typename Convert>
py::list ListReleasingGil(Get&& get, Convert&& convert) {
  decltype(get()) items;
  {
    py::gil_scoped_release release;
    items = get();
  }
  py::list out;
  for (const auto& item : items) out.append(convert(item));
  return out;
}

}  // namespace percolite::bindings
