// Python bindings of the client library (pybind11): what an LMCache-style
// connector in a vLLM process needs. Staging memory is exposed as a writable
// buffer (memoryview / numpy.frombuffer), so tensors are copied into it once and
// the agent moves them from there.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "client/client.h"

namespace py = pybind11;
using namespace dpukv;

namespace {

struct PyStaging {
  Staging s;
};

void check(Status st, const char* what) {
  if (!st.ok()) throw std::runtime_error(std::string(what) + ": " + std::string(st.name()));
}

std::vector<ChunkKey> keys_from_ids(uint64_t model, const std::vector<uint64_t>& ids) {
  std::vector<ChunkKey> k;
  for (uint64_t id : ids) k.push_back(key_from_block_id(KeyContext{model, 1, 0, 0}, id));
  return k;
}

}  // namespace

PYBIND11_MODULE(dpukv, m) {
  m.doc() = "dpukv client: KV-cache offload through the dpukv agent";
  py::class_<ChunkKey>(m, "ChunkKey")
      .def_readonly("model", &ChunkKey::model)
      .def_readonly("prefix_hash", &ChunkKey::prefix_hash)
      .def("__eq__", [](const ChunkKey& a, const ChunkKey& b) { return a == b; })
      .def("__repr__", [](const ChunkKey& k) {
        char b[64];
        std::snprintf(b, sizeof(b), "ChunkKey(prefix=%016llx)",
                      static_cast<unsigned long long>(k.prefix_hash));
        return std::string(b);
      });
  m.def("model_id", &model_id, "xxh3-64 of a model name");
  m.def(
      "chunk_keys",
      [](uint64_t model, const std::vector<int32_t>& tokens, uint32_t chunk_tokens,
         bool include_partial, uint32_t world_size, uint32_t rank, uint64_t layout) {
        std::vector<ChunkKey> out;
        chunk_keys(KeyContext{model, world_size, rank, layout}, tokens.data(), tokens.size(),
                   chunk_tokens, include_partial, &out);
        return out;
      },
      py::arg("model"), py::arg("tokens"), py::arg("chunk_tokens") = 256,
      py::arg("include_partial") = false, py::arg("world_size") = 1, py::arg("rank") = 0,
      py::arg("layout") = 0);

  py::class_<PyStaging>(m, "Staging", py::buffer_protocol())
      .def_property_readonly("size", [](const PyStaging& s) { return s.s.size; })
      .def_buffer([](PyStaging& s) -> py::buffer_info {
        return py::buffer_info(s.s.data, 1, py::format_descriptor<uint8_t>::format(), 1, {s.s.size},
                               {1});
      });

  py::class_<Client>(m, "Client")
      .def(py::init([](const std::string& socket, uint64_t model, uint32_t connect_timeout_ms) {
             ClientOptions o;
             o.socket_path = socket;
             o.model = model;
             o.connect_timeout_ms = connect_timeout_ms;
             std::unique_ptr<Client> c;
             check(Client::connect(o, &c), "connect");
             return c;
           }),
           py::arg("socket") = "", py::arg("model") = 0, py::arg("connect_timeout_ms") = 2000)
      .def("alloc_staging",
           [](Client& c, size_t bytes) {
             PyStaging s;
             check(c.alloc_staging(bytes, &s.s), "alloc_staging");
             return s;
           })
      .def(
          "store",
          [](Client& c, const PyStaging& s, const std::vector<ChunkKey>& keys,
             const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths) {
            if (keys.size() != offsets.size() || keys.size() != lengths.size())
              throw std::invalid_argument("keys, offsets and lengths differ in length");
            std::vector<Status> st(keys.size());
            py::gil_scoped_release nogil;
            (void)c.store(s.s, keys.data(), offsets.data(), lengths.data(),
                          static_cast<uint32_t>(keys.size()), st.data());
            std::vector<std::string> names;
            for (Status x : st) names.emplace_back(x.name());
            return names;
          },
          "Stores regions of a staging buffer; returns a status name per key")
      .def("retrieve",
           [](Client& c, const PyStaging& s, const std::vector<ChunkKey>& keys,
              const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths) {
             if (keys.size() != offsets.size() || keys.size() != lengths.size())
               throw std::invalid_argument("keys, offsets and lengths differ in length");
             std::vector<Status> st(keys.size());
             py::gil_scoped_release nogil;
             (void)c.retrieve(s.s, keys.data(), offsets.data(), lengths.data(),
                              static_cast<uint32_t>(keys.size()), st.data());
             std::vector<std::string> names;
             for (Status x : st) names.emplace_back(x.name());
             return names;
           })
      .def(
          "lookup",
          [](Client& c, const std::vector<ChunkKey>& keys, bool pin) {
            py::gil_scoped_release nogil;
            return c.lookup(keys.data(), static_cast<uint32_t>(keys.size()), pin);
          },
          py::arg("keys"), py::arg("pin") = false,
          "Leading keys present (0 when the agent is away)")
      .def("stats",
           [](Client& c) {
             std::string j;
             check(c.stats_json(&j), "stats");
             return j;
           })
      .def("connected", &Client::connected);
  m.def("keys_from_block_ids", &keys_from_ids,
        "Keys from prefix-chained block ids (vLLM block hashes, trace ids)");
}
