// percolite._core: the thin pybind11 layer over the core.
//
// Rules (design.md section 8): arguments are converted while the GIL is held;
// every call into the core runs with the GIL released; core errors become
// Python exceptions through ErrorClassName, the one translation table.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "percolite/env.h"
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

  py::class_<PyEnv>(m, "Env")
      .def_static(
          "open",
          [](const std::string& path, const std::string& sync, bool create, unsigned mode,
             size_t map_size, unsigned max_readers) {
            percolite::StoreOptions options;
            options.sync = ParseSync(sync);
            options.create = create;
            options.file_mode = mode;
            options.initial_map_size = map_size;
            options.max_readers = max_readers;
            auto env = std::make_unique<PyEnv>();
            py::gil_scoped_release release;
            env->env = percolite::Env::Open(path, options);
            return env;
          },
          py::arg("path"), py::arg("sync"), py::arg("create"), py::arg("mode"), py::arg("map_size"),
          py::arg("max_readers"))
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
      .def_property_readonly("closed", [](PyEnv& self) { return self.env->closed(); })
      .def_property_readonly("path", [](PyEnv& self) { return self.env->path(); })
      .def("stats", [](PyEnv& self) {
        percolite::StoreStats s;
        {
          py::gil_scoped_release release;
          s = self.env->Stats();
        }
        py::dict d;
        d["commits"] = s.commits;
        d["conflicts"] = s.conflicts;
        d["batches"] = s.batches;
        d["tombstones_collected"] = s.tombstones_collected;
        d["map_size"] = s.map_size;
        d["map_growths"] = s.map_growths;
        return d;
      });

  py::class_<Tx, std::shared_ptr<Tx>>(m, "Transaction")
      .def_property_readonly("start_ts", &Tx::start_ts)
      .def_property_readonly("commit_ts",
                             [](Tx& self) {
                               py::gil_scoped_release release;
                               return self.commit_ts();
                             })
      .def_property_readonly("state",
                             [](Tx& self) {
                               Tx::State s;
                               {
                                 py::gil_scoped_release release;
                                 s = self.state();
                               }
                               switch (s) {
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
             py::gil_scoped_release release;
             self.Set(cell.ref(), bytes);
           })
      .def("delete",
           [](Tx& self, py::handle row, py::handle column) {
             CellArg cell = ToCell(row, column);
             py::gil_scoped_release release;
             self.Delete(cell.ref());
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
}
