#include "percolite/combine_queue.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "callables.h"
#include "codecs.h"
#include "convert.h"
#include "percolite/export_queue.h"

namespace percolite::bindings {

// Longer than our functions usually are: one chained table of the class's
// bound methods, which reads best whole, as the Python class it becomes.
void BindCombineQueue(py::module_& m) {
  py::class_<percolite::CombineQueue, std::shared_ptr<percolite::CombineQueue>>(m, "CombineQueue")
      .def_static(
          "create",
          [](const std::string& id, uint32_t buckets, size_t buffer_size, py::object combiner,
             const std::string& value_type, size_t tuple_length, py::object on_change,
             const std::vector<std::shared_ptr<percolite::ExportQueue>>& export_to, double linger,
             uint32_t max_attempts) {
            percolite::CombineQueueOptions options;
            options.max_attempts = max_attempts;
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
          py::arg("linger") = 0.0, py::arg("max_attempts") = percolite::kDefaultMaxAttempts)
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
      .def("counters",
           [](percolite::CombineQueue& self) {
             auto [batches, entries] = self.Counters();
             return py::make_tuple(batches, entries);
           })
      .def("bucket_of", [](percolite::CombineQueue& self,
                           py::bytes key) { return self.BucketOf(std::string(key)); })
      .def_property_readonly(
          "entry_row_prefix",
          [](percolite::CombineQueue& self) { return py::bytes(self.EntryRowPrefix()); })
      .def("data_row_prefix",
           [](percolite::CombineQueue& self, uint32_t bucket) {
             if (bucket >= self.options().buckets) throw py::value_error("no such bucket");
             return py::bytes(self.DataRowPrefix(bucket));
           })
      .def_property_readonly("notify_column", [](percolite::CombineQueue& self) {
        auto c = self.NotifyColumn();
        return py::make_tuple(py::bytes(c.family), py::bytes(c.qualifier), c.observer);
      });
}

}  // namespace percolite::bindings
