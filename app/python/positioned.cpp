// sluice._sluice.PositionedRecords: a source read at places Python chooses (sluice/core/
// positioned_records.hpp), what sluice.data's data sources (_data_sources.py) stand on.
#include "sluice/core/positioned_records.hpp"

#include "native.hpp"

namespace sluice::python {
namespace {

// The places Python asked for, checked: non-negative integers.
std::vector<std::uint64_t> places_of(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& keys) {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(keys.size()));
  const std::int64_t* data = keys.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (data[i] < 0) throw py::value_error("record " + std::to_string(data[i]) + " is negative");
    out[i] = static_cast<std::uint64_t>(data[i]);
  }
  return out;
}

// Reads without the GIL; a file that cannot be read is an OSError, a refused parameter a ValueError.
template <class Read>
auto reading(Read&& read) {
  try {
    py::gil_scoped_release release;
    return read();
  } catch (const ParamError& e) {
    throw py::value_error(e.what());
  } catch (const DataError& e) {
    PyErr_SetString(PyExc_OSError, e.what());
    throw py::error_already_set();
  }
}

}  // namespace

void bind_positioned(py::module_& m) {
  using Records = PositionedRecords;
  py::class_<Records, std::shared_ptr<Records>>(m, "PositionedRecords", "A source read at the places the caller chooses.")
      .def(py::init([](const std::string& op, const std::map<std::string, std::string>& params) {
             Registry& registry = loaded_registry({});
             return reading([&] { return std::make_shared<Records>(registry, op, std::vector<std::pair<std::string, std::string>>(params.begin(), params.end())); });
           }),
           py::arg("op"), py::arg("params"))
      .def("__len__", [](const Records& r) { return r.size(); })
      .def("read", [](Records& r, const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& keys) {
        const auto samples = reading([&] { return r.read(places_of(keys)); });
        py::list out;
        for (const Sample& s : samples) out.append(to_python(s));
        return out;
      }, py::arg("positions"), "the records at these places, as dicts of their fields")
      .def("read_field", [](Records& r, const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& keys, const std::string& field) {
        const auto samples = reading([&] { return r.read(places_of(keys)); });
        py::list out;
        for (const Sample& s : samples) out.append(to_python(s.at(field)));
        return out;
      }, py::arg("positions"), py::arg("field"), "one field of the records at these places")
      .def("stored_fields", [](const Records& r) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& f : r.stored_fields()) out.emplace_back(f.name, f.type);
        return out;
      })
      .def("files", [](const Records& r) {
        std::vector<std::tuple<std::string, std::int64_t, std::int64_t>> out;
        for (const auto& f : r.files()) out.emplace_back(f.where, f.first, f.end);
        return out;
      }, "each file with the first and end of the records read from it");
}

}  // namespace sluice::python
