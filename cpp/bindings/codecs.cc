#include "codecs.h"

#include <cstdint>
#include <cstring>

#include "percolite/encoding.h"
#include "percolite/status.h"

namespace percolite::bindings {

namespace {

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

}  // namespace

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

// Made as tuple.__new__ makes one (tp_alloc, then the items), not through the
// class's Python-level __new__. When every item is atomic (str, bytes, int,
// float, None) or an untracked tuple, it is left untracked by the garbage
// collector, as in DecodeFast. A large batch of export entries otherwise
// sets off collections that walk every one of them (bench/bench_export.py
// measures the cost; bench/results/notes.md keeps the figure).
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

py::object RawExportEntry(const percolite::ExportEntry& e) {
  return py::make_tuple(py::bytes(e.key), py::bytes(e.value), e.seq);
}

py::object DecodeExportEntry(PyTypeObject* entry_type, const percolite::ExportEntry& e,
                             const FastCodec& key_codec, const FastCodec& value_codec) {
  // As ExportValue() queued it: a tag byte, 0 for a deletion (None) or 1, then the value.
  std::string_view value(e.value);
  if (value.empty() || (value[0] != '\0' && value[0] != '\1')) {
    throw percolite::Error(ErrorCode::kCorruption, "a queued export value has no tag byte");
  }
  py::object decoded = value[0] == '\0' ? py::none() : DecodeFast(value.substr(1), value_codec);
  return MakeTupleOf(entry_type, {DecodeFast(e.key, key_codec), decoded, py::int_(e.seq)});
}

}  // namespace percolite::bindings
