#include "convert.h"

namespace percolite::bindings {

std::string TypeName(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

std::string ToBytes(py::handle h, const char* what) {
  if (PyBytes_Check(h.ptr())) {
    return std::string(PyBytes_AS_STRING(h.ptr()), PyBytes_GET_SIZE(h.ptr()));
  }
  if (PyUnicode_Check(h.ptr())) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(h.ptr(), &size);
    if (data == nullptr) throw py::error_already_set();
    return std::string(data, size);
  }
  if (PyByteArray_Check(h.ptr())) {
    return std::string(PyByteArray_AS_STRING(h.ptr()), PyByteArray_GET_SIZE(h.ptr()));
  }
  if (PyMemoryView_Check(h.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_CONTIG_RO) != 0) {
      PyErr_Clear();
      throw py::type_error(std::string(what) + " must be a contiguous memoryview");
    }
    std::string out(static_cast<const char*>(view.buf), view.len);
    PyBuffer_Release(&view);
    return out;
  }
  std::string message = std::string(what) + " must be bytes or str, not " + TypeName(h);
  if (h.is_none() && std::string(what) == "value") {
    message += "; use delete(row, column) to remove a cell";
  }
  throw py::type_error(message);
}

std::pair<std::string, std::string> ToColumn(py::handle column) {
  if (!PyTuple_Check(column.ptr()) || PyTuple_GET_SIZE(column.ptr()) != 2) {
    throw py::type_error(
        "column must be a (family, qualifier) tuple or a percolite.Column, not " +
        (PyTuple_Check(column.ptr())
             ? "a tuple of " + std::to_string(PyTuple_GET_SIZE(column.ptr())) + " items"
             : TypeName(column)));
  }
  return {ToBytes(PyTuple_GET_ITEM(column.ptr(), 0), "column family"),
          ToBytes(PyTuple_GET_ITEM(column.ptr(), 1), "column qualifier")};
}

CellArg ToCell(py::handle row, py::handle column) {
  CellArg cell;
  cell.row = ToBytes(row, "row");
  auto [family, qualifier] = ToColumn(column);
  cell.family = std::move(family);
  cell.qualifier = std::move(qualifier);
  return cell;
}

namespace {

bool BytesView(PyObject* h, std::string_view* out) {
  if (PyBytes_Check(h)) {
    *out = std::string_view(PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h));
    return true;
  }
  if (PyUnicode_Check(h)) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(h, &size);  // cached in the str
    if (data == nullptr) {
      PyErr_Clear();
      return false;
    }
    *out = std::string_view(data, size);
    return true;
  }
  return false;
}

}  // namespace

bool CellViews(PyObject* row, PyObject* column, percolite::CellRef* out) {
  return PyTuple_Check(column) && PyTuple_GET_SIZE(column) == 2 && BytesView(row, &out->row) &&
         BytesView(PyTuple_GET_ITEM(column, 0), &out->family) &&
         BytesView(PyTuple_GET_ITEM(column, 1), &out->qualifier);
}

py::object OptionalBytes(const std::optional<std::string>& value) {
  if (!value) return py::none();
  return py::bytes(*value);
}

percolite::SyncMode ParseSync(const std::string& sync) {
  if (sync == "full") return percolite::SyncMode::kFull;
  if (sync == "meta") return percolite::SyncMode::kMeta;
  if (sync == "none") return percolite::SyncMode::kNone;
  throw py::value_error("sync must be 'full', 'meta' or 'none', not '" + sync + "'");
}

percolite::NativeCombiner ParseCombiner(const std::string& name) {
  if (name == "sum") return percolite::NativeCombiner::kSum;
  if (name == "max") return percolite::NativeCombiner::kMax;
  if (name == "min") return percolite::NativeCombiner::kMin;
  if (name == "last") return percolite::NativeCombiner::kLast;
  throw py::value_error("combiner must be 'sum', 'max', 'min', 'last' or a callable, not '" + name +
                        "'");
}

percolite::ValueType ParseValueType(const std::string& name) {
  if (name == "int64") return percolite::ValueType::kInt64;
  if (name == "float64") return percolite::ValueType::kFloat64;
  if (name == "int64s") return percolite::ValueType::kInt64Tuple;
  return percolite::ValueType::kBytes;
}

py::dict ObserverStatsToDict(const percolite::ObserverStats& s) {
  py::dict d;
  d["name"] = s.column.observer;
  d["family"] = py::bytes(s.column.family);
  d["qualifier"] = py::bytes(s.column.qualifier);
  d["notify"] = s.column.kind == percolite::NotifyKind::kStrong ? "strong" : "weak";
  d["runs"] = s.runs;
  d["commits"] = s.commits;
  d["conflicts"] = s.conflicts;
  d["failures"] = s.failures;
  d["deferrals"] = s.deferrals;
  d["parked"] = s.parked;
  d["skipped_parked"] = s.skipped_parked;
  d["running"] = s.running;
  d["last_error"] =
      s.last_error.empty() ? py::object(py::none()) : py::object(py::str(s.last_error));
  d["last_failure_unix"] = s.last_failure_unix > 0 ? py::object(py::float_(s.last_failure_unix))
                                                   : py::object(py::none());
  py::dict writes;
  for (const auto& [target, n] : s.writes) {
    // "family:F" with F any bytes: text as JSON and logs need it, undecodable bytes escaped.
    py::object key = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
        target.data(), static_cast<Py_ssize_t>(target.size()), "backslashreplace"));
    if (!key) throw py::error_already_set();
    writes[key] = n;
  }
  d["writes"] = writes;
  return d;
}

namespace {

py::object UnixTime(double seconds) {
  return seconds > 0 ? py::object(py::float_(seconds)) : py::object(py::none());
}

// Text from the store: UTF-8, any malformed bytes replaced.
py::str Text(const std::string& bytes) {
  PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), bytes.size(), "replace");
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

py::dict ErrorDetailToDict(const percolite::ErrorDetail& e) {
  py::dict d;
  d["type"] = Text(e.type);
  d["message"] = Text(e.message);
  d["traceback"] = Text(e.traceback);
  return d;
}

// row, family and qualifier of an encoded cell key (None each when malformed).
void PutCell(py::dict& d, const std::string& cell_key) {
  percolite::Cell cell;
  if (percolite::DecodeCellKey(cell_key, &cell)) {
    d["row"] = py::bytes(cell.row);
    d["family"] = py::bytes(cell.family);
    d["qualifier"] = py::bytes(cell.qualifier);
  } else {
    d["row"] = py::none();
    d["family"] = py::none();
    d["qualifier"] = py::none();
  }
}

}  // namespace

py::dict WorkRecordToDict(const percolite::WorkRecord& r) {
  py::dict d;
  d["observer"] = Text(r.observer);
  PutCell(d, r.cell_key);
  d["key"] = r.key ? py::object(py::bytes(*r.key)) : py::object(py::none());
  d["attempts"] = r.attempts;
  d["parked"] = r.parked;
  static const char* const kSinkNames[] = {nullptr, "down", "refused"};
  const char* sink = kSinkNames[static_cast<int>(r.sink)];
  d["sink"] = sink ? py::object(py::str(sink)) : py::object(py::none());
  d["first_failure_unix"] = UnixTime(r.first_failure_unix);
  d["last_failure_unix"] = UnixTime(r.last_failure_unix);
  d["error"] = ErrorDetailToDict(r.error);
  return d;
}

py::dict FailureSummaryToDict(const percolite::FailureSummary& s) {
  py::dict d;
  d["observer"] = Text(s.observer);
  d["failures"] = s.failures;
  d["parked"] = s.parked;
  d["first_failure_unix"] = UnixTime(s.first_failure_unix);
  d["last_failure_unix"] = UnixTime(s.last_failure_unix);
  py::dict where;
  PutCell(where, s.last_cell_key);
  d["last_cell"] = where;
  d["last_error"] = ErrorDetailToDict(s.last_error);
  return d;
}

py::dict LeaseHolderToDict(const percolite::LeaseHolder& h) {
  py::dict d;
  d["owner"] = Text(h.owner);
  d["group"] = Text(h.group);
  d["threads"] = h.threads;
  d["expires_unix"] = h.expires_unix;
  d["renewed_unix"] = h.renewed_unix;
  d["live"] = h.live;
  d["partitions"] = h.partitions;
  return d;
}

}  // namespace percolite::bindings
