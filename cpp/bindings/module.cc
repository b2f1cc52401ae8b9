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
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/export_queue.h"
#include "percolite/queue_limits.h"
#include "percolite/transaction.h"

namespace py = pybind11;
using percolite::ErrorCode;

namespace {

// The one table from core error codes to Python exception classes
// (python/percolite/errors.py defines the classes).
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

std::string TypeName(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// bytes, bytearray and memoryview are taken as they are; str means UTF-8.
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

struct CellArg {
  std::string row, family, qualifier;
  percolite::CellRef ref() const { return {row, family, qualifier}; }
};

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

using Tx = percolite::Transaction;

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A Python callable held by C++ threads: copied only as a shared_ptr, and
// released with the GIL held.
struct PyCallable {
  py::object fn;
  explicit PyCallable(py::object f) : fn(std::move(f)) {}
  ~PyCallable() {
    if (!Py_IsInitialized() || InterpreterFinalizing()) {
      fn.release();  // the interpreter is going away: leak rather than crash
      return;
    }
    py::gil_scoped_acquire gil;
    fn = py::object();
  }
};

// Python runners (python/percolite/_app.py, _combine.py) report a failure by
// returning (False, traceback) instead of raising, so the traceback is
// formatted once, in Python; (True, result) is a success.
percolite::Status RunnerStatus(const py::tuple& outcome) {
  if (outcome[0].cast<bool>()) return percolite::Status::Ok();
  return percolite::Status::Make(ErrorCode::kCallback, py::str(outcome[1]));
}

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
percolite::ObserverFn MakeObserverFn(py::object runner) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  return [holder](const std::shared_ptr<Tx>& tx, const percolite::Cell& cell) {
    return CallPython([&] {
      return RunnerStatus(
          holder->fn(tx, py::bytes(cell.row), py::bytes(cell.family), py::bytes(cell.qualifier)));
    });
  };
}

// A combiner: runner(key, [values]) -> (True, value | None) or (False, traceback).
percolite::CombineFn MakeCombineFn(py::object runner) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  return [holder](std::string_view key, const std::vector<std::string_view>& values,
                  std::optional<std::string>* result) {
    return CallPython([&] {
      py::list py_values(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        py_values[i] = py::bytes(values[i].data(), values[i].size());
      }
      py::tuple outcome = holder->fn(py::bytes(key.data(), key.size()), py_values);
      percolite::Status status = RunnerStatus(outcome);
      if (status.ok()) {
        py::object value = outcome[1];
        if (value.is_none()) {
          result->reset();
        } else {
          *result = value.cast<std::string>();
        }
      }
      return status;
    });
  };
}

// A change observer: runner(core_tx, [(key, old, new)]) -> (ok, traceback).
percolite::ChangeFn MakeChangeFn(py::object runner) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  return [holder](const std::shared_ptr<Tx>& tx, const std::vector<percolite::Change>& changes) {
    return CallPython([&] {
      py::list items(changes.size());
      for (size_t i = 0; i < changes.size(); ++i) {
        const auto& c = changes[i];
        items[i] = py::make_tuple(py::bytes(c.key),
                                  c.old_value ? py::object(py::bytes(*c.old_value)) : py::none(),
                                  c.new_value ? py::object(py::bytes(*c.new_value)) : py::none());
      }
      return RunnerStatus(holder->fn(tx, items));
    });
  };
}

// The built-in codecs of python/percolite/codecs.py that the queues encode
// and decode here, with no Python per item: the hot path of cq.add and of the
// export queue's deliveries. The layouts must match codecs.py exactly (a test
// compares them); anything these do not take exactly goes the Python way.
struct FastCodec {
  enum Kind { kStr, kBytes, kInt64, kFloat64, kInt64s } kind = kBytes;
  size_t length = 0;  // for kInt64s
};

// (name, length) from codecs.fast_codec(), or nullopt for None.
std::optional<FastCodec> ParseFastCodec(py::handle spec) {
  if (spec.is_none()) return std::nullopt;
  auto t = py::reinterpret_borrow<py::tuple>(spec);
  const std::string name = t[0].cast<std::string>();
  FastCodec codec;
  codec.length = t[1].cast<size_t>();
  if (name == "str") {
    codec.kind = FastCodec::kStr;
  } else if (name == "bytes") {
    codec.kind = FastCodec::kBytes;
  } else if (name == "int64") {
    codec.kind = FastCodec::kInt64;
  } else if (name == "float64") {
    codec.kind = FastCodec::kFloat64;
  } else if (name == "int64s" && codec.length >= 1) {
    codec.kind = FastCodec::kInt64s;
  } else {
    throw py::value_error("no native codec '" + name + "'");
  }
  return codec;
}

// An int (not a bool) that fits int64, appended big-endian; false otherwise.
bool AppendInt64Exact(PyObject* h, std::string* out) {
  if (!PyLong_Check(h) || PyBool_Check(h)) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  percolite::AppendUint64BE(out, static_cast<uint64_t>(v));
  return true;
}

// Appends `h` encoded as `codec` would; false (nothing reliable appended)
// when the value is not exactly of the codec's kind: the caller then falls
// back to the Python codec, which raises the error users see.
bool EncodeFast(PyObject* h, const FastCodec& codec, std::string* out) {
  switch (codec.kind) {
    case FastCodec::kStr: {
      if (!PyUnicode_Check(h)) return false;
      Py_ssize_t size = 0;
      const char* data = PyUnicode_AsUTF8AndSize(h, &size);
      if (data == nullptr) {  // lone surrogates: not UTF-8
        PyErr_Clear();
        return false;
      }
      out->append(data, size);
      return true;
    }
    case FastCodec::kBytes:
      if (!PyBytes_Check(h)) return false;
      out->append(PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h));
      return true;
    case FastCodec::kInt64:
      return AppendInt64Exact(h, out);
    case FastCodec::kFloat64: {
      if (!PyFloat_Check(h)) return false;  // ints (and their range errors) go the Python way
      const double v = PyFloat_AS_DOUBLE(h);
      uint64_t u;
      std::memcpy(&u, &v, 8);
      percolite::AppendUint64BE(out, u);
      return true;
    }
    case FastCodec::kInt64s: {
      const bool tuple = PyTuple_Check(h);
      if (!tuple && !PyList_Check(h)) return false;
      const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(h) : PyList_GET_SIZE(h);
      if (n != static_cast<Py_ssize_t>(codec.length)) return false;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = tuple ? PyTuple_GET_ITEM(h, i) : PyList_GET_ITEM(h, i);
        if (!AppendInt64Exact(item, out)) return false;
      }
      return true;
    }
  }
  return false;
}

// The Python value of `data` as `codec` decodes it.
py::object DecodeFast(std::string_view data, const FastCodec& codec) {
  switch (codec.kind) {
    case FastCodec::kStr: {
      PyObject* text =
          PyUnicode_DecodeUTF8(data.data(), static_cast<Py_ssize_t>(data.size()), "strict");
      if (text == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(text);
    }
    case FastCodec::kBytes:
      return py::bytes(data.data(), data.size());
    case FastCodec::kInt64:
    case FastCodec::kFloat64:
    case FastCodec::kInt64s:
      break;
  }
  const size_t width = codec.kind == FastCodec::kInt64s ? codec.length : 1;
  if (data.size() != 8 * width) {
    throw percolite::Error(ErrorCode::kCorruption,
                           "a queued value has " + std::to_string(data.size()) +
                               " bytes, expected " + std::to_string(8 * width));
  }
  auto read = [&](size_t i) { return percolite::ReadUint64BE(data.substr(8 * i, 8)); };
  if (codec.kind == FastCodec::kFloat64) {
    const uint64_t u = read(0);
    double v;
    std::memcpy(&v, &u, 8);
    return py::float_(v);
  }
  if (codec.kind == FastCodec::kInt64) {
    return py::int_(static_cast<int64_t>(read(0)));
  }
  py::tuple out(width);
  for (size_t i = 0; i < width; ++i) out[i] = py::int_(static_cast<int64_t>(read(i)));
  // Ints only: no cycle can run through it, so the garbage collector need
  // not track it (CPython untracks such tuples itself, at its next pass).
  PyObject_GC_UnTrack(out.ptr());
  return std::move(out);
}

// An instance of `type`, a tuple subclass such as a NamedTuple, holding
// `items`: made as tuple.__new__ makes one (tp_alloc, then the items), not
// through the class's Python-level __new__. When every item is atomic (str,
// bytes, int, float, None) or an untracked tuple, it is left untracked by the
// garbage collector, as above. A batch of 65,536 export entries otherwise
// sets off collections that walk every one of them (13% of the export
// queue's time in the 10,000 document phrase count).
py::object MakeTupleOf(PyTypeObject* type, std::initializer_list<py::object> items) {
  PyObject* made = type->tp_alloc(type, static_cast<Py_ssize_t>(items.size()));
  if (made == nullptr) throw py::error_already_set();
  bool atomic = true;
  Py_ssize_t i = 0;
  for (const py::object& item : items) {
    PyObject* p = item.ptr();
    atomic = atomic && (p == Py_None || PyUnicode_CheckExact(p) || PyBytes_CheckExact(p) ||
                        PyLong_CheckExact(p) || PyFloat_CheckExact(p) ||
                        (PyTuple_CheckExact(p) && !PyObject_GC_IsTracked(p)));
    PyTuple_SET_ITEM(made, i++, py::object(item).release().ptr());
  }
  if (atomic && type->tp_dictoffset == 0) PyObject_GC_UnTrack(made);  // no __dict__ either
  return py::reinterpret_steal<py::object>(made);
}

// An exporter: runner([(key, value, seq)]) -> (ok, traceback), with the raw
// queued bytes. With both codecs native, runner gets decoded entries instead:
// [entry_type(key, value or None, seq)].
percolite::ExportFn MakeExportFn(py::object runner, py::object entry_type, py::object key_codec,
                                 py::object value_codec) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  std::optional<FastCodec> kc = ParseFastCodec(key_codec), vc = ParseFastCodec(value_codec);
  std::shared_ptr<PyCallable> type;
  if (kc && vc) {
    if (!PyType_Check(entry_type.ptr()) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(entry_type.ptr()), &PyTuple_Type)) {
      throw py::type_error("the export entry type must be a tuple subclass");
    }
    type = std::make_shared<PyCallable>(std::move(entry_type));
  }
  return [holder, type, kc, vc](const std::vector<percolite::ExportEntry>& entries) {
    return CallPython([&] {
      py::list items(entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        if (!type) {
          items[i] = py::make_tuple(py::bytes(e.key), py::bytes(e.value), e.seq);
          continue;
        }
        std::string_view value(e.value);
        if (value.empty() || (value[0] != '\0' && value[0] != '\1')) {
          throw percolite::Error(ErrorCode::kCorruption, "a queued export value has no tag byte");
        }
        py::object decoded = value[0] == '\0' ? py::none() : DecodeFast(value.substr(1), *vc);
        items[i] = MakeTupleOf(reinterpret_cast<PyTypeObject*>(type->fn.ptr()),
                               {DecodeFast(e.key, *kc), decoded, py::int_(e.seq)});
      }
      return RunnerStatus(holder->fn(items));
    });
  };
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
  d["running"] = s.running;
  d["last_error"] =
      s.last_error.empty() ? py::object(py::none()) : py::object(py::str(s.last_error));
  d["last_failure_unix"] = s.last_failure_unix > 0 ? py::object(py::float_(s.last_failure_unix))
                                                   : py::object(py::none());
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "percolite core (C++17 on LMDB). Use the 'percolite' package, not this module.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const percolite::Error& e) {
      TranslateError(e);
    }
  });

  {
    py::tuple names(percolite::BackendNames().size());
    size_t i = 0;
    for (const std::string& name : percolite::BackendNames()) names[i++] = name;
    m.attr("BACKENDS") = names;  // what percolite.open(..., backend=) accepts
  }

  py::class_<PyEnv>(m, "Env")
      .def_static(
          "open",
          [](const std::string& path, const std::string& sync, bool create, unsigned mode,
             size_t map_size, unsigned max_readers, const std::string& backend) {
            percolite::BackendOptions options;
            options.sync = ParseSync(sync);
            options.create = create;
            options.file_mode = mode;
            options.initial_map_size = map_size;
            options.max_readers = max_readers;
            auto env = std::make_unique<PyEnv>();
            py::gil_scoped_release release;
            env->env = percolite::Env::Open(path, options, backend);
            return env;
          },
          py::arg("path"), py::arg("sync"), py::arg("create"), py::arg("mode"), py::arg("map_size"),
          py::arg("max_readers"), py::arg("backend") = "")
      .def("begin",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             return self.env->Begin();
           })
      .def("close",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             self.env->Close();
           })
      .def("set_observers",
           [](PyEnv& self, py::list specs) {
             // specs: [(family, qualifier, kind, name, runner), ...]
             std::vector<percolite::Observer> observers;
             for (py::handle spec : specs) {
               auto t = spec.cast<py::tuple>();
               percolite::Observer o;
               o.column.family = ToBytes(t[0], "column family");
               o.column.qualifier = ToBytes(t[1], "column qualifier");
               o.column.kind = static_cast<percolite::NotifyKind>(t[2].cast<int>());
               o.column.observer = t[3].cast<std::string>();
               if (py::isinstance<percolite::CombineQueue>(t[4])) {
                 o.fn = t[4].cast<std::shared_ptr<percolite::CombineQueue>>()->Processor();
               } else if (py::isinstance<percolite::ExportQueue>(t[4])) {
                 o.fn = t[4].cast<std::shared_ptr<percolite::ExportQueue>>()->Processor();
               } else {
                 o.fn = MakeObserverFn(py::reinterpret_borrow<py::object>(t[4]));
               }
               observers.push_back(std::move(o));
             }
             py::gil_scoped_release release;
             self.env->SetObservers(std::move(observers));
           })
      .def(
          "start_workers",
          [](PyEnv& self, int threads, int worker_index, int worker_count, double retry_initial,
             double retry_max) {
            percolite::WorkerOptions options;
            options.threads = threads;
            options.worker_index = worker_index;
            options.worker_count = worker_count;
            options.retry_initial_seconds = retry_initial;
            options.retry_max_seconds = retry_max;
            py::gil_scoped_release release;
            self.env->StartWorkers(options);
          },
          py::arg("threads"), py::arg("worker_index"), py::arg("worker_count"),
          py::arg("retry_initial"), py::arg("retry_max"))
      .def("stop_workers",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             self.env->StopWorkers();
           })
      .def("wait_idle",
           [](PyEnv& self, double timeout) {
             py::gil_scoped_release release;
             return self.env->WaitIdle(timeout);
           })
      .def("worker_stats",
           [](PyEnv& self) {
             percolite::WorkerStats s;
             {
               py::gil_scoped_release release;
               s = self.env->GetWorkerStats();
             }
             py::dict d;
             d["running"] = s.running;
             d["threads"] = s.threads;
             d["queued"] = s.queued;
             d["active"] = s.active;
             d["scans"] = s.scans;
             py::list observers;
             for (const auto& o : s.observers) observers.append(ObserverStatsToDict(o));
             d["observers"] = observers;
             return d;
           })
      .def("observed_columns",
           [](PyEnv& self) {
             std::vector<percolite::ObservedColumn> columns;
             {
               py::gil_scoped_release release;
               columns = self.env->ObservedColumns();
             }
             py::list out;
             for (const auto& c : columns) {
               out.append(py::make_tuple(
                   py::bytes(c.family), py::bytes(c.qualifier),
                   c.kind == percolite::NotifyKind::kStrong ? "strong" : "weak", c.observer));
             }
             return out;
           })
      .def("pending_notifications",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             return self.env->backend()->PendingNotifications();
           })
      .def("pending_by_column",
           [](PyEnv& self) {
             std::map<std::pair<std::string, std::string>, uint64_t> counts;
             {
               py::gil_scoped_release release;
               counts = self.env->backend()->CountPendingByColumn();
             }
             py::dict out;
             for (const auto& [column, n] : counts) {
               out[py::make_tuple(py::bytes(column.first), py::bytes(column.second))] = n;
             }
             return out;
           })
      .def("scan_notifications",
           [](PyEnv& self, py::bytes after, size_t limit) {
             std::vector<percolite::Notification> found;
             std::string after_key = after;
             {
               py::gil_scoped_release release;
               self.env->backend()->ScanNotifications(after_key, limit, &found);
             }
             py::list out;
             for (const auto& n : found) {
               percolite::Cell cell;
               percolite::DecodeCellKey(n.cell_key, &cell);
               out.append(py::make_tuple(
                   py::bytes(cell.row), py::bytes(cell.family), py::bytes(cell.qualifier), n.stamp,
                   py::bytes(percolite::NotificationKey(n.row_hash, n.cell_key))));
             }
             return out;
           })
      .def_property_readonly("closed", [](PyEnv& self) { return self.env->closed(); })
      .def_property_readonly("path", [](PyEnv& self) { return self.env->path(); })
      .def_property_readonly("capabilities",
                             [](PyEnv& self) {
                               const percolite::BackendCapabilities& c = self.env->capabilities();
                               py::dict d;
                               d["name"] = c.name;
                               d["persistent"] = c.persistent;
                               d["cross_process"] = c.cross_process;
                               d["durable"] = c.durable;
                               d["max_value_size"] = c.max_value_size;
                               return d;
                             })
      .def("stats", [](PyEnv& self) {
        percolite::BackendStats s;
        {
          py::gil_scoped_release release;
          s = self.env->Stats();
        }
        py::dict d;
        d["commits"] = s.commits;
        d["conflicts"] = s.conflicts;
        d["batches"] = s.batches;
        d["inline_batches"] = s.inline_batches;
        d["tombstones_collected"] = s.tombstones_collected;
        d["map_size"] = s.map_size;
        d["map_growths"] = s.map_growths;
        return d;
      });

  py::class_<percolite::CombineQueue, std::shared_ptr<percolite::CombineQueue>>(m, "CombineQueue")
      .def_static(
          "create",
          [](const std::string& id, uint32_t buckets, size_t buffer_size, py::object combiner,
             const std::string& value_type, size_t tuple_length, py::object on_change,
             const std::vector<std::shared_ptr<percolite::ExportQueue>>& export_to, double linger) {
            percolite::CombineQueueOptions options;
            options.id = id;
            options.buckets = buckets;
            options.buffer_size = buffer_size;
            options.linger_seconds = linger;
            options.value_type = ParseValueType(value_type);
            options.tuple_length = tuple_length;
            if (py::isinstance<py::str>(combiner)) {
              options.native = ParseCombiner(combiner.cast<std::string>());
            } else {
              options.native = percolite::NativeCombiner::kNone;
              options.combiner = MakeCombineFn(combiner);
            }
            if (!on_change.is_none()) options.on_change = MakeChangeFn(on_change);
            options.export_to.assign(export_to.begin(), export_to.end());
            return percolite::CombineQueue::Create(std::move(options));
          },
          py::arg("id"), py::arg("buckets"), py::arg("buffer_size"), py::arg("combiner"),
          py::arg("value_type"), py::arg("tuple_length"), py::arg("on_change"),
          py::arg("export_to") = std::vector<std::shared_ptr<percolite::ExportQueue>>(),
          py::arg("linger") = 0.0)
      .def("add",
           [](percolite::CombineQueue& self, Tx& tx, py::list updates) {
             std::vector<std::pair<std::string, std::string>> pairs;
             pairs.reserve(updates.size());
             for (py::handle item : updates) {
               auto t = py::reinterpret_borrow<py::tuple>(item);
               pairs.emplace_back(ToBytes(t[0], "key"), ToBytes(t[1], "value"));
             }
             self.Add(tx, pairs);  // buffers in memory only: keeps the GIL
           })
      // Encodes with built-in codecs here; False, with nothing queued, when an
      // item does not fit them exactly (the caller then encodes in Python).
      .def("add_native",
           [](percolite::CombineQueue& self, Tx& tx, py::handle updates, py::handle key_codec,
              py::handle value_codec) {
             const FastCodec kc = *ParseFastCodec(key_codec);
             const FastCodec vc = *ParseFastCodec(value_codec);
             std::vector<std::pair<std::string, std::string>> pairs;
             auto encode = [&](PyObject* key, PyObject* value) {
               pairs.emplace_back();
               return EncodeFast(key, kc, &pairs.back().first) &&
                      EncodeFast(value, vc, &pairs.back().second);
             };
             PyObject* obj = updates.ptr();
             if (PyDict_CheckExact(obj)) {
               pairs.reserve(PyDict_GET_SIZE(obj));
               Py_ssize_t pos = 0;
               PyObject *key, *value;
               while (PyDict_Next(obj, &pos, &key, &value)) {
                 if (!encode(key, value)) return false;
               }
             } else if (PyList_CheckExact(obj)) {
               pairs.reserve(PyList_GET_SIZE(obj));
               for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj); ++i) {
                 PyObject* item = PyList_GET_ITEM(obj, i);
                 if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) return false;
                 if (!encode(PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1))) return false;
               }
             } else {
               return false;
             }
             self.Add(tx, pairs);  // buffers in memory only: keeps the GIL
             return true;
           })
      .def("get",
           [](percolite::CombineQueue& self, Tx& tx, py::bytes key) {
             std::string k = key;
             std::optional<std::string> value;
             {
               py::gil_scoped_release release;
               value = self.Get(tx, k);
             }
             return OptionalBytes(value);
           })
      .def("bucket_of", [](percolite::CombineQueue& self,
                           py::bytes key) { return self.BucketOf(std::string(key)); })
      .def("data_row_prefix",
           [](percolite::CombineQueue& self, uint32_t bucket) {
             if (bucket >= self.options().buckets) throw py::value_error("no such bucket");
             return py::bytes(self.DataRowPrefix(bucket));
           })
      .def_property_readonly("notify_column", [](percolite::CombineQueue& self) {
        auto c = self.NotifyColumn();
        return py::make_tuple(py::bytes(c.family), py::bytes(c.qualifier), c.observer);
      });

  py::class_<percolite::ExportQueue, std::shared_ptr<percolite::ExportQueue>>(m, "ExportQueue")
      .def_static(
          "create",
          [](const std::string& id, uint32_t buckets, size_t batch_size, py::object exporter,
             py::object entry_type, py::object key_codec, py::object value_codec, double linger) {
            percolite::ExportQueueOptions options;
            options.id = id;
            options.buckets = buckets;
            options.batch_size = batch_size;
            options.linger_seconds = linger;
            options.exporter = MakeExportFn(std::move(exporter), std::move(entry_type),
                                            std::move(key_codec), std::move(value_codec));
            return percolite::ExportQueue::Create(std::move(options));
          },
          py::arg("id"), py::arg("buckets"), py::arg("batch_size"), py::arg("exporter"),
          py::arg("entry_type") = py::none(), py::arg("key_codec") = py::none(),
          py::arg("value_codec") = py::none(), py::arg("linger") = 0.0)
      .def("add",
           [](percolite::ExportQueue& self, Tx& tx, py::bytes key, py::bytes value) {
             self.Add(tx, std::string(key), std::string(value));  // buffers only: keeps the GIL
           })
      .def("bucket_of", [](percolite::ExportQueue& self,
                           py::bytes key) { return self.BucketOf(std::string(key)); })
      .def_property_readonly(
          "entry_row_prefix",
          [](percolite::ExportQueue& self) { return py::bytes(self.EntryRowPrefix()); })
      .def_property_readonly("notify_column", [](percolite::ExportQueue& self) {
        auto c = self.NotifyColumn();
        return py::make_tuple(py::bytes(c.family), py::bytes(c.qualifier), c.observer);
      });

  py::class_<Tx, std::shared_ptr<Tx>>(m, "Transaction")
      .def_property_readonly("start_ts", &Tx::start_ts)
      .def_property_readonly("commit_ts", &Tx::commit_ts)
      .def_property_readonly("state",
                             [](Tx& self) {
                               switch (self.state()) {
                                 case Tx::State::kActive:
                                   return "active";
                                 case Tx::State::kCommitted:
                                   return "committed";
                                 case Tx::State::kAborted:
                                   return "aborted";
                                 case Tx::State::kClosed:
                                   return "closed";
                               }
                               return "?";
                             })
      .def("get",
           [](Tx& self, py::handle row, py::handle column) {
             CellArg cell = ToCell(row, column);
             std::optional<std::string> value;
             {
               py::gil_scoped_release release;
               value = self.Get(cell.ref());
             }
             return OptionalBytes(value);
           })
      .def("get_many",
           [](Tx& self, py::iterable cells) {
             std::vector<CellArg> args;
             for (py::handle item : cells) {
               if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 2) {
                 throw py::type_error("get_many takes (row, column) pairs, not " + TypeName(item));
               }
               args.push_back(
                   ToCell(PyTuple_GET_ITEM(item.ptr(), 0), PyTuple_GET_ITEM(item.ptr(), 1)));
             }
             std::vector<std::optional<std::string>> values;
             {
               py::gil_scoped_release release;
               values.reserve(args.size());
               for (const CellArg& cell : args) values.push_back(self.Get(cell.ref()));
             }
             py::list out(values.size());
             for (size_t i = 0; i < values.size(); ++i) out[i] = OptionalBytes(values[i]);
             return out;
           })
      .def("set",
           [](Tx& self, py::handle row, py::handle column, py::handle value) {
             CellArg cell = ToCell(row, column);
             std::string bytes = ToBytes(value, "value");
             self.Set(cell.ref(), bytes);
           })
      .def("delete",
           [](Tx& self, py::handle row, py::handle column) {
             CellArg cell = ToCell(row, column);
             self.Delete(cell.ref());
           })
      .def("set_weak_notification",
           [](Tx& self, py::handle row, py::handle column) {
             CellArg cell = ToCell(row, column);
             self.SetWeakNotification(cell.ref());
           })
      .def(
          "scan_chunk",
          [](Tx& self, py::object prefix, py::object start, py::object end, py::object columns,
             py::object resume_after, size_t limit) {
            percolite::ScanRange range;
            if (!start.is_none() || !end.is_none()) {
              std::string start_row = start.is_none() ? "" : ToBytes(start, "start");
              std::optional<std::string> end_row;
              if (!end.is_none()) end_row = ToBytes(end, "end");
              range = percolite::ScanRange::Rows(start_row, end_row);
            } else {
              range = percolite::ScanRange::RowPrefix(prefix.is_none() ? std::string()
                                                                       : ToBytes(prefix, "prefix"));
            }
            if (!columns.is_none()) {
              for (py::handle column : py::iter(columns)) range.columns.push_back(ToColumn(column));
            }
            std::optional<std::string> resume;
            if (!resume_after.is_none()) resume = ToBytes(resume_after, "resume_after");
            percolite::ScanChunk chunk;
            {
              py::gil_scoped_release release;
              chunk = self.Scan(range, resume ? &*resume : nullptr, limit);
            }
            py::list items(chunk.items.size());
            for (size_t i = 0; i < chunk.items.size(); ++i) {
              const auto& item = chunk.items[i];
              items[i] = py::make_tuple(py::bytes(item.cell.row), py::bytes(item.cell.family),
                                        py::bytes(item.cell.qualifier), py::bytes(item.value));
            }
            return py::make_tuple(items, py::bytes(chunk.resume_after), chunk.done);
          },
          py::arg("prefix"), py::arg("start"), py::arg("end"), py::arg("columns"),
          py::arg("resume_after"), py::arg("limit"))
      .def("commit", &Tx::Commit, py::call_guard<py::gil_scoped_release>())
      .def("abort", &Tx::Abort, py::call_guard<py::gil_scoped_release>());

  // ---- Constants: limits, layout facts and defaults of the core, which the
  // Python package reads from here instead of repeating them.
  m.attr("SEQ_INDEX_BITS") = percolite::kSeqIndexBits;
  m.attr("MAX_BUCKETS") = percolite::kMaxBuckets;
  m.attr("MAX_LINGER_SECONDS") = percolite::kMaxLingerSeconds;
  m.attr("NOTIFY_STRONG") = static_cast<int>(percolite::NotifyKind::kStrong);
  m.attr("NOTIFY_WEAK") = static_cast<int>(percolite::NotifyKind::kWeak);
  m.attr("SYNC_MODES") = py::make_tuple("full", "meta", "none");  // as ParseSync reads them
  m.attr("NATIVE_COMBINERS") = py::make_tuple("sum", "max", "min", "last");  // ParseCombiner's
  const percolite::BackendOptions backend;
  m.attr("DEFAULT_FILE_MODE") = backend.file_mode;
  m.attr("DEFAULT_MAP_SIZE") = backend.initial_map_size;
  m.attr("DEFAULT_MAX_READERS") = backend.max_readers;
  const percolite::WorkerOptions workers;
  m.attr("DEFAULT_THREADS") = workers.threads;
  m.attr("DEFAULT_RETRY_INITIAL") = workers.retry_initial_seconds;
  m.attr("DEFAULT_RETRY_MAX") = workers.retry_max_seconds;
  const percolite::CombineQueueOptions combine;
  m.attr("DEFAULT_COMBINE_BUCKETS") = combine.buckets;
  m.attr("DEFAULT_BUFFER_SIZE") = combine.buffer_size;
  m.attr("DEFAULT_BATCH_SIZE") = percolite::ExportQueueOptions().batch_size;
}
