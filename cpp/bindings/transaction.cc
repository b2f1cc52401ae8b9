#include "percolite/transaction.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
// after Python.h, which bindings.h includes
#include <structmember.h>

namespace percolite::bindings {

namespace {

// The app's own writes, by column family, for the dataflow graph
// (Transaction::CountWrite); a queue's internal rows are written in C++.
void CountFamilyWrite(Tx& tx, const CellArg& cell) { tx.CountWrite("family", cell.family); }

// Snapshot::ValueView: the value as a new bytes object (nullptr, with
// MemoryError set, when there is no memory for it).
void TakeBytes(void* context, std::string_view value) {
  *static_cast<PyObject**>(context) =
      PyBytes_FromStringAndSize(value.data(), static_cast<Py_ssize_t>(value.size()));
}

// Transaction.get(row, column, default=None), called once per cell read from
// Python loops, so bound by hand (METH_FASTCALL) rather than through
// pybind11's generic dispatch. The usual read of a local store runs with the
// GIL held: releasing and taking it back would cost more than the read. It
// is released only when the read would wait (another thread inside the
// transaction, a map growth, a server's answer), as every other read does.
PyObject* FastGet(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  // row, column, default: by position, or (any of them) by name
  static const char* const kNames[] = {"row", "column", "default"};
  PyObject* given[3] = {nullptr, nullptr, Py_None};
  nargs = PyVectorcall_NARGS(nargs);
  if (nargs > 3) {
    PyErr_Format(PyExc_TypeError, "get() takes row, column and an optional default (%zd given)",
                 nargs);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) given[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    int slot = -1;
    for (int i = 0; i < 3; ++i) {
      if (PyUnicode_CompareWithASCIIString(name, kNames[i]) == 0) slot = i;
    }
    if (slot < 0 || slot < nargs) {
      PyErr_Format(PyExc_TypeError,
                   slot < 0 ? "get() got an unexpected keyword argument %R"
                            : "get() got multiple values for argument %R",
                   name);
      return nullptr;
    }
    given[slot] = args[nargs + k];
  }
  if (given[0] == nullptr || given[1] == nullptr) {
    PyErr_Format(PyExc_TypeError, "get() takes row, column and an optional default (%zd given)",
                 nargs + nkw);
    return nullptr;
  }
  PyObject* const row = given[0];
  PyObject* const column = given[1];
  PyObject* const fallback = given[2];
  try {
    Tx& tx = py::handle(self).cast<Tx&>();
    percolite::CellRef ref;
    if (CellViews(row, column, &ref)) {
      PyObject* value = nullptr;
      switch (tx.TryGet(ref, &TakeBytes, &value)) {
        case percolite::Snapshot::TryRead::kFound:
          return value;
        case percolite::Snapshot::TryRead::kAbsent:
          return Py_NewRef(fallback);
        case percolite::Snapshot::TryRead::kWouldBlock:
          break;
      }
    }
    CellArg cell = ToCell(row, column);  // names a bad argument
    std::optional<std::string> value;
    {
      py::gil_scoped_release release;
      value = tx.Get(cell.ref());
    }
    if (!value) return Py_NewRef(fallback);
    return PyBytes_FromStringAndSize(value->data(), static_cast<Py_ssize_t>(value->size()));
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

percolite::ScanRange ToScanRange(py::handle prefix, py::handle start, py::handle end,
                                 py::handle columns) {
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
  return range;
}

// A tuple subclass that adds no fields (a NamedTuple, percolite.Column),
// whose objects can be made as plain tuples are.
PyTypeObject* TupleType(py::handle type, const char* what) {
  if (!PyType_Check(type.ptr()) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type.ptr()), &PyTuple_Type) ||
      reinterpret_cast<PyTypeObject*>(type.ptr())->tp_basicsize != PyTuple_Type.tp_basicsize) {
    throw py::type_error(std::string(what) + " must be a tuple subclass without fields of its own");
  }
  return reinterpret_cast<PyTypeObject*>(type.ptr());
}

// A new tuple of `type` holding `items` (references stolen; nullptr items
// mean an error is set, and then so does the result).
PyObject* NewTuple(PyTypeObject* type, std::initializer_list<PyObject*> items) {
  const auto size = static_cast<Py_ssize_t>(items.size());
  const bool complete =
      std::all_of(items.begin(), items.end(), [](PyObject* item) { return item != nullptr; });
  PyObject* tuple = !complete               ? nullptr
                    : type == &PyTuple_Type ? PyTuple_New(size)
                                            : type->tp_alloc(type, size);
  if (tuple == nullptr) {
    for (PyObject* item : items) Py_XDECREF(item);
    return nullptr;
  }
  Py_ssize_t i = 0;
  for (PyObject* item : items) PyTuple_SET_ITEM(tuple, i++, item);
  return tuple;
}

PyObject* Bytes(const char* data, size_t size) {
  return PyBytes_FromStringAndSize(data, static_cast<Py_ssize_t>(size));
}

// The cells of `packed` as a list of cell_type(row, column_type(family,
// qualifier), value). A row, or a column, the same as the previous cell's is
// shared with it rather than made again: a scan yields many cells per row,
// and the same few columns over and over.
py::list CellList(const percolite::PackedCells& packed, PyTypeObject* cell_type,
                  PyTypeObject* column_type) {
  const size_t n = packed.size();
  py::list out(n);
  const char* at = packed.bytes.data();
  py::object row, column;  // the previous cell's
  std::string_view last_row, last_family, last_qualifier;
  for (size_t i = 0; i < n; ++i) {
    const size_t* size = &packed.sizes[4 * i];
    const std::string_view row_bytes(at, size[0]), family(at + size[0], size[1]),
        qualifier(at + size[0] + size[1], size[2]);
    const char* value = at + size[0] + size[1] + size[2];
    at = value + size[3];
    if (!row || row_bytes != last_row) {
      row = py::reinterpret_steal<py::object>(Bytes(row_bytes.data(), row_bytes.size()));
      if (!row) throw py::error_already_set();
      last_row = row_bytes;
    }
    if (!column || family != last_family || qualifier != last_qualifier) {
      column = py::reinterpret_steal<py::object>(NewTuple(
          column_type,
          {Bytes(family.data(), family.size()), Bytes(qualifier.data(), qualifier.size())}));
      if (!column) throw py::error_already_set();
      last_family = family;
      last_qualifier = qualifier;
    }
    PyObject* cell =
        NewTuple(cell_type, {Py_NewRef(row.ptr()), Py_NewRef(column.ptr()), Bytes(value, size[3])});
    if (cell == nullptr) throw py::error_already_set();
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), cell);
  }
  return out;
}

PyMethodDef fast_get_def = {"get",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&FastGet)),
                            METH_FASTCALL | METH_KEYWORDS,
                            "get($self, row, column, default=None)\n--\n\n"
                            "The value of the cell in this transaction's view, or ``default``."};

// The same get, bound on a Python class that holds the core transaction in a
// slot (percolite.Transaction, the class users hold): the method reads the
// slot at its fixed offset and goes straight to FastGet, with no Python frame
// in between, which would cost a tenth of a look-up.
Py_ssize_t surface_slot_offset = -1;

PyObject* SurfaceGet(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* core =
      *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(self) + surface_slot_offset);
  if (core == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "the transaction holds no core transaction");
    return nullptr;
  }
  return FastGet(core, args, nargs, kwnames);
}

PyMethodDef surface_get_def = {
    "get", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&SurfaceGet)),
    METH_FASTCALL | METH_KEYWORDS, fast_get_def.ml_doc};

// Binds SurfaceGet as `cls.get`, reading the object slot `slot` of `cls`.
void BindSurfaceGet(py::handle cls, const std::string& slot) {
  if (!PyType_Check(cls.ptr())) throw py::type_error("bind_surface_get takes a class");
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  PyObject* member = PyDict_GetItemString(type->tp_dict, slot.c_str());  // borrowed
  if (member == nullptr || !Py_IS_TYPE(member, &PyMemberDescr_Type) ||
      reinterpret_cast<PyMemberDescrObject*>(member)->d_member->type != T_OBJECT_EX) {
    throw py::type_error("bind_surface_get: " + slot + " is not an object slot of the class");
  }
  const Py_ssize_t offset = reinterpret_cast<PyMemberDescrObject*>(member)->d_member->offset;
  if (surface_slot_offset != -1 && surface_slot_offset != offset) {
    throw py::value_error("bind_surface_get: bound already, at another slot");
  }
  surface_slot_offset = offset;
  py::object get = py::reinterpret_steal<py::object>(PyDescr_NewMethod(type, &surface_get_def));
  if (!get) throw py::error_already_set();
  cls.attr("get") = get;
}

}  // namespace

// Longer than our functions usually are: one chained table of the class's
// bound methods, which reads best whole, as the Python class it becomes.
void BindTransaction(py::module_& m) {
  py::class_<Tx, std::shared_ptr<Tx>> cls(m, "Transaction");
  py::object get = py::reinterpret_steal<py::object>(
      PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &fast_get_def));
  if (!get) throw py::error_already_set();
  cls.attr("get") = get;
  m.def("bind_surface_get", &BindSurfaceGet, py::arg("cls"), py::arg("slot"),
        "Binds the core's get as cls.get, reading the core transaction from the object "
        "slot `slot` (for percolite.Transaction).");
  cls.def_property_readonly("start_ts", &Tx::start_ts)
      .def_property_readonly("commit_ts", &Tx::commit_ts)
      .def_property_readonly("state",
                             [](Tx& self) {
                               switch (self.state()) {
                                 case Tx::State::kActive:
                                   return "active";
                                 case Tx::State::kCommitting:
                                   return "committing";
                                 case Tx::State::kCommitted:
                                   return "committed";
                                 case Tx::State::kAborted:
                                   return "aborted";
                                 case Tx::State::kClosed:
                                   return "closed";
                               }
                               return "?";
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
             CountFamilyWrite(self, cell);
           })
      .def("delete",
           [](Tx& self, py::handle row, py::handle column) {
             CellArg cell = ToCell(row, column);
             self.Delete(cell.ref());
             CountFamilyWrite(self, cell);
           })
      .def("set_weak_notification",
           [](Tx& self, py::handle row, py::handle column) {
             CellArg cell = ToCell(row, column);
             self.SetWeakNotification(cell.ref());
           })
      .def(
          "scan_cells",
          [](Tx& self, py::handle prefix, py::handle start, py::handle end, py::handle columns,
             py::handle resume_after, size_t limit, py::handle cell_type, py::handle column_type) {
            PyTypeObject* cells = TupleType(cell_type, "cell_type");
            PyTypeObject* column = TupleType(column_type, "column_type");
            percolite::ScanRange range = ToScanRange(prefix, start, end, columns);
            std::optional<std::string> resume;
            if (!resume_after.is_none()) resume = ToBytes(resume_after, "resume_after");
            percolite::PackedCells packed;
            {
              py::gil_scoped_release release;
              self.ScanPacked(range, resume ? &*resume : nullptr, limit, &packed);
            }
            return py::make_tuple(CellList(packed, cells, column), py::bytes(packed.resume_after),
                                  packed.done);
          },
          py::arg("prefix"), py::arg("start"), py::arg("end"), py::arg("columns"),
          py::arg("resume_after"), py::arg("limit"), py::arg("cell_type"), py::arg("column_type"))
      .def(
          "scan_chunk",
          [](Tx& self, py::object prefix, py::object start, py::object end, py::object columns,
             py::object resume_after, size_t limit) {
            percolite::ScanRange range = ToScanRange(prefix, start, end, columns);
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

}  // namespace percolite::bindings
