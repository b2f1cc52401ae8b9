#include "percolite/export_queue.h"

#include <memory>
#include <string>
#include <utility>

#include "bindings.h"
#include "callables.h"

namespace percolite::bindings {

void BindExportQueue(py::module_& m) {
  py::class_<percolite::ExportQueue, std::shared_ptr<percolite::ExportQueue>>(m, "ExportQueue")
      .def_static(
          "create",
          [](const std::string& id, uint32_t buckets, size_t batch_size, py::object exporter,
             py::object entry_type, py::object key_codec, py::object value_codec, double linger,
             uint32_t max_attempts) {
            percolite::ExportQueueOptions options;
            options.max_attempts = max_attempts;
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
          py::arg("value_codec") = py::none(), py::arg("linger") = 0.0,
          py::arg("max_attempts") = percolite::kDefaultMaxAttempts)
      .def("add",
           [](percolite::ExportQueue& self, Tx& tx, py::bytes key, py::bytes value) {
             self.Add(tx, std::string(key), std::string(value));  // buffers only: keeps the GIL
           })
      .def("counters",
           [](percolite::ExportQueue& self) {
             auto [batches, entries] = self.Counters();
             return py::make_tuple(batches, entries);
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
}

}  // namespace percolite::bindings
