#include "percolite/transaction.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"

namespace percolite::bindings {

namespace {

// The app's own writes, by column family, for the dataflow graph
// (Transaction::CountWrite); a queue's internal rows are written in C++.
void CountFamilyWrite(Tx& tx, const CellArg& cell) { tx.CountWrite("family", cell.family); }

}  // namespace

// Longer than our functions usually are: one chained table of the class's
// bound methods, which reads best whole, as the Python class it becomes.
void BindTransaction(py::module_& m) {
  py::class_<Tx, std::shared_ptr<Tx>>(m, "Transaction")
      .def_property_readonly("start_ts", &Tx::start_ts)
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

}  // namespace percolite::bindings
