// The built-in codecs of python/percolite/codecs.py that the queues encode
// and decode here, with no Python per item: the hot path of cq.add and of the
// export queue's deliveries. The layouts must match codecs.py exactly (a test
// compares them); anything these do not take exactly goes the Python way.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "percolite/export_queue.h"

namespace py = pybind11;

namespace percolite::bindings {

struct FastCodec {
  enum Kind { kStr, kBytes, kInt64, kFloat64, kInt64s } kind = kBytes;
  size_t length = 0;  // for kInt64s
};

// (name, length) from codecs.fast_codec(), or nullopt for None.
std::optional<FastCodec> ParseFastCodec(py::handle spec);

// Appends `h` encoded as `codec` would; false (nothing reliable appended)
// when the value is not exactly of the codec's kind: the caller then falls
// back to the Python codec, which raises the error users see.
bool EncodeFast(PyObject* h, const FastCodec& codec, std::string* out);

// The Python value of `data` as `codec` decodes it.
py::object DecodeFast(std::string_view data, const FastCodec& codec);

// An instance of `type`, a tuple subclass such as a NamedTuple, holding
// `items`, left untracked by the garbage collector when nothing in it can be
// part of a cycle (see codecs.cc).
py::object MakeTupleOf(PyTypeObject* type, std::initializer_list<py::object> items);

// An export entry as the exporter runner gets it with the raw queued bytes:
// (key, value, seq).
py::object RawExportEntry(const percolite::ExportEntry& e);

// An export entry decoded by the native codecs: entry_type(key, value or
// None, seq), entry_type a tuple subclass.
py::object DecodeExportEntry(PyTypeObject* entry_type, const percolite::ExportEntry& e,
                             const FastCodec& key_codec, const FastCodec& value_codec);

}  // namespace percolite::bindings
