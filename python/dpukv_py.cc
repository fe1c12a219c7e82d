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
#include "dpukv/client.h"

namespace py = pybind11;
using namespace dpukv;

namespace {

// Host staging (a writable buffer), or GPU memory exported to the agent (gpu:
// no host bytes; store and retrieve take it the same way).
struct PyStaging {
  Staging s;
  bool gpu = false;
  GpuStaging g;
};

// The GPU path is not there (no CUDA driver here, none in the agent, a GPU the
// agent does not see): the caller uses host staging instead.
struct GpuPathUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The agent did not answer (gone, restarting, too slow): Python's ConnectionError,
// so a connector can tell "recompute, the cache is away" from a bug.
struct AgentUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(Status st, const char* what) {
  if (st.ok()) return;
  std::string msg = std::string(what) + ": " + std::string(st.name()) + " (" +
                    std::string(st.description()) + ")";
  if (st == Code::kConnectionReset || st == Code::kTimeout || st == Code::kNotFound ||
      st == Code::kShutdown)
    throw AgentUnavailable(msg);
  throw std::runtime_error(msg);
}

// A client that close() can end before the Python object goes.
struct PyClient {
  std::unique_ptr<Client> c;
  Client& get() {
    if (!c) throw std::runtime_error("client is closed");
    return *c;
  }
};

// An asynchronous store or retrieve: the statuses the agent writes must outlive
// the call, so they live here until wait() collects them.
struct PyPending {
  Client::Ticket ticket = 0;
  std::vector<Status> st;
  bool collected = false;
};

std::vector<std::string> names(const std::vector<Status>& st) {
  std::vector<std::string> out;
  for (Status x : st) out.emplace_back(x.name());
  return out;
}

void check_lengths(const std::vector<ChunkKey>& keys, const std::vector<uint64_t>& offsets,
                   const std::vector<uint64_t>& lengths) {
  if (keys.size() != offsets.size() || keys.size() != lengths.size())
    throw std::invalid_argument("keys, offsets and lengths differ in length");
}

using SubmitOp = Status (Client::*)(const Staging&, const ChunkKey*, const uint64_t*,
                                    const uint64_t*, uint32_t, Status*, Client::Ticket*);
std::unique_ptr<PyPending> submit(Client& c, SubmitOp op, const PyStaging& s,
                                  const std::vector<ChunkKey>& keys,
                                  const std::vector<uint64_t>& offsets,
                                  const std::vector<uint64_t>& lengths) {
  check_lengths(keys, offsets, lengths);
  auto p = std::make_unique<PyPending>();
  p->st.resize(keys.size());
  check((c.*op)(s.s, keys.data(), offsets.data(), lengths.data(),
                static_cast<uint32_t>(keys.size()), p->st.data(), &p->ticket),
        "submit");
  return p;
}

// Per-entry answers of the agent; raises when the call itself failed (then no
// entry has an answer).
using KeysOp = Status (Client::*)(const ChunkKey*, uint32_t, Status*, Status*);
std::vector<std::string> keys_call(Client& c, KeysOp op, const std::vector<ChunkKey>& keys,
                                   const char* what) {
  std::vector<Status> st(keys.size());
  Status call;
  {
    py::gil_scoped_release nogil;
    (void)(c.*op)(keys.data(), static_cast<uint32_t>(keys.size()), st.data(), &call);
  }
  check(call, what);
  return names(st);
}

using IoOp = Status (Client::*)(const Staging&, const ChunkKey*, const uint64_t*, const uint64_t*,
                                uint32_t, Status*, Status*);
std::vector<std::string> io_call(Client& c, IoOp op, const PyStaging& s,
                                 const std::vector<ChunkKey>& keys,
                                 const std::vector<uint64_t>& offsets,
                                 const std::vector<uint64_t>& lengths, const char* what) {
  check_lengths(keys, offsets, lengths);
  std::vector<Status> st(keys.size());
  Status call;
  {
    py::gil_scoped_release nogil;
    (void)(c.*op)(s.s, keys.data(), offsets.data(), lengths.data(),
                  static_cast<uint32_t>(keys.size()), st.data(), &call);
  }
  check(call, what);
  return names(st);
}

std::vector<ChunkKey> keys_from_ids(uint64_t model, const std::vector<uint64_t>& ids) {
  std::vector<ChunkKey> k;
  for (uint64_t id : ids) k.push_back(key_from_block_id(KeyContext{model, 1, 0, 0}, id));
  return k;
}

}  // namespace

PYBIND11_MODULE(_dpukv, m) {
  m.doc() = "dpukv client: KV-cache offload through the dpukv agent";
  py::register_exception<AgentUnavailable>(m, "AgentUnavailable", PyExc_ConnectionError);
  py::register_exception<GpuPathUnavailable>(m, "GpuPathUnavailable", PyExc_RuntimeError);
  py::class_<ChunkKey>(m, "ChunkKey")
      .def_readonly("model", &ChunkKey::model)
      .def_readonly("world_size", &ChunkKey::world_size)
      .def_readonly("rank", &ChunkKey::rank)
      .def_readonly("layout", &ChunkKey::layout)
      .def_readonly("prefix_hash", &ChunkKey::prefix_hash)
      .def("__eq__", [](const ChunkKey& a, const ChunkKey& b) { return a == b; })
      .def("__repr__", [](const ChunkKey& k) {
        char b[64];
        std::snprintf(b, sizeof(b), "ChunkKey(prefix=%016llx)",
                      static_cast<unsigned long long>(k.prefix_hash));
        return std::string(b);
      });
  m.def("model_id", &model_id, py::arg("name"), "xxh3-64 of a model name");
  m.def("kv_layout_fingerprint", &kv_layout_fingerprint, py::arg("dtype"), py::arg("layers"),
        py::arg("kv_heads"), py::arg("head_dim"),
        "Fingerprint of a KV layout, the layout field of chunk keys");
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
  m.def(
      "chunk_keys_layers",
      [](uint64_t model, const std::vector<int32_t>& tokens, uint32_t chunk_tokens,
         bool include_partial, uint32_t world_size, uint32_t rank,
         const std::vector<uint64_t>& layouts) {
        // The C ABI's, as the ctypes client calls it: one implementation.
        const uint32_t cap = static_cast<uint32_t>(tokens.size() / std::max(chunk_tokens, 1u) + 1);
        std::vector<ChunkKey> flat(layouts.size() * cap);
        const uint32_t n = dpukv_chunk_keys_layers(
            model, world_size, rank, layouts.data(), static_cast<uint32_t>(layouts.size()),
            tokens.data(), tokens.size(), chunk_tokens, include_partial ? 1 : 0,
            reinterpret_cast<dpukv_key*>(flat.data()), cap);
        std::vector<std::vector<ChunkKey>> out(layouts.size());
        for (size_t l = 0; l < layouts.size(); ++l)
          out[l].assign(flat.begin() + l * cap, flat.begin() + l * cap + n);
        return out;
      },
      py::arg("model"), py::arg("tokens"), py::arg("chunk_tokens"), py::arg("include_partial"),
      py::arg("world_size"), py::arg("rank"), py::arg("layouts"),
      "chunk_keys for several layouts (one per layer) at the cost of one");

  // The KV codecs for a connector that encodes its own chunks (dpukv.kv_codec):
  // buffers by address (tensor.data_ptr()), as the C ABI takes them.
  m.def("kv_encode_bound", &dpukv_kv_encode_bound, py::arg("codec"), py::arg("slabs"),
        py::arg("tokens"), py::arg("channels"), py::arg("flags"), py::arg("nbytes"),
        "The largest encoding of nbytes (0 for an unknown codec or flags)");
  m.def(
      "kv_encode",
      [](int codec, int dtype, uint32_t slabs, uint32_t tokens, uint32_t channels, uint32_t flags,
         uint64_t src, size_t nbytes, uint64_t dst, size_t cap) {
        size_t out = 0;
        int rc;
        {
          py::gil_scoped_release nogil;
          rc = dpukv_kv_encode(codec, dtype, slabs, tokens, channels, flags,
                               reinterpret_cast<const void*>(src), nbytes,
                               reinterpret_cast<void*>(dst), cap, &out);
        }
        if (rc != 0)
          throw std::invalid_argument(std::string("kv_encode: ") + dpukv_status_name(rc));
        return out;
      },
      py::arg("codec"), py::arg("dtype"), py::arg("slabs"), py::arg("tokens"), py::arg("channels"),
      py::arg("flags"), py::arg("src"), py::arg("nbytes"), py::arg("dst"), py::arg("cap"),
      "Encodes nbytes at address src into dst (cap bytes); returns the encoded length. flags: "
      "1 (values per token) when the slabs alternate keys and values");
  m.def(
      "kv_decode_rows",
      [](uint64_t base, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& caps,
         uint64_t rows, uint32_t rows_per_chunk, uint32_t last_rows, uint64_t row_bytes) {
        if (offsets.size() != caps.size())
          throw std::invalid_argument("kv_decode_rows: offsets and caps differ in length");
        std::vector<int> per(offsets.size());
        {
          py::gil_scoped_release nogil;
          (void)dpukv_kv_decode_rows(reinterpret_cast<const void*>(base), offsets.data(),
                                     caps.data(), static_cast<uint32_t>(offsets.size()),
                                     reinterpret_cast<void* const*>(rows), rows_per_chunk,
                                     last_rows, row_bytes, per.data());
        }
        std::vector<std::string> out;
        for (int rc : per) out.emplace_back(dpukv_status_name(rc));
        return out;
      },
      py::arg("base"), py::arg("offsets"), py::arg("caps"), py::arg("rows"),
      py::arg("rows_per_chunk"), py::arg("last_rows"), py::arg("row_bytes"),
      "Decodes the chunks at base + offsets (slots of caps bytes) into rows (the address "
      "of an array of row addresses); a status name per chunk");

  py::class_<PyStaging>(m, "Staging", py::buffer_protocol())
      .def_property_readonly("size", [](const PyStaging& s) { return s.s.size; })
      .def_property_readonly(
          "data_ptr", [](const PyStaging& s) { return reinterpret_cast<uint64_t>(s.s.data); })
      .def_property_readonly("gpu", [](const PyStaging& s) { return s.gpu; })
      .def_property_readonly("device_ptr", [](const PyStaging& s) { return s.g.device_ptr; })
      .def_buffer([](PyStaging& s) -> py::buffer_info {
        if (s.gpu) throw std::invalid_argument("GPU staging has no host buffer");
        return py::buffer_info(s.s.data, 1, py::format_descriptor<uint8_t>::format(), 1, {s.s.size},
                               {1});
      });

  py::class_<PyPending>(m, "Pending");

  py::class_<PyClient>(m, "Client")
      .def(py::init([](const std::string& socket, uint64_t model, uint32_t connect_timeout_ms,
                       bool absent_ok) {
             ClientOptions o;
             o.socket_path = socket;
             o.model = model;
             o.connect_timeout_ms = connect_timeout_ms;
             o.absent_ok = absent_ok;
             PyClient pc;
             const Status st = Client::connect(o, &pc.c);
             const std::string why = std::string("connect: ") + Client::last_connect_error();
             // A full agent is away for this client: a connector recomputes.
             if (st == Code::kFull) throw AgentUnavailable(why + ": FULL");
             check(st, why.c_str());
             return pc;
           }),
           py::arg("socket") = "", py::arg("model") = 0, py::arg("connect_timeout_ms") = 2000,
           py::arg("absent_ok") = false)
      .def(
          "alloc_staging",
          [](PyClient& pc, size_t bytes) {
            Client& c = pc.get();
            PyStaging s;
            check(c.alloc_staging(bytes, &s.s), "alloc_staging");
            return s;
          },
          py::arg("nbytes"))
      .def(
          "export_gpu",
          [](PyClient& pc, uint64_t ptr, size_t bytes, int device) {
            Client& c = pc.get();
            PyStaging s;
            std::string why;
            Status st;
            {
              py::gil_scoped_release nogil;
              st = c.export_gpu(ptr, bytes, device, &s.g, &why);
            }
            if (st == Code::kNotSupported || st == Code::kNotPermitted)
              throw GpuPathUnavailable("export_gpu: " + std::string(st.name()) + ": " + why);
            if (st == Code::kInvalidValue) throw std::invalid_argument("export_gpu: " + why);
            check(st, "export_gpu");
            s.gpu = true;
            s.s = s.g.staging();
            return s;
          },
          py::arg("device_ptr"), py::arg("nbytes"), py::arg("device") = 0,
          "Exports GPU memory (a device pointer: tensor.data_ptr()) to the agent, which "
          "copies into and out of it; store/retrieve take the result as a staging buffer. "
          "Raises GpuPathUnavailable when there is no GPU path (use host staging)")
      .def(
          "release_gpu",
          [](PyClient& pc, const PyStaging& s) {
            if (!s.gpu) throw std::invalid_argument("not a GPU staging");
            check(pc.get().release_gpu(s.g), "release_gpu");
          },
          py::arg("staging"), "Closes a GPU export at the agent")
      .def_property_readonly("agent_gpu", [](PyClient& pc) { return pc.get().agent_gpu(); })
      .def(
          "share_memory",
          [](PyClient& pc, uint64_t addr, size_t bytes) {
            PyStaging s;
            check(pc.get().share_memory(reinterpret_cast<void*>(addr), bytes, &s.s),
                  "share_memory");
            return s;
          },
          py::arg("addr"), py::arg("nbytes"),
          "Exports memory this process keeps using (a CPU tensor's storage: data_ptr()) in "
          "place: the whole pages inside it move onto shared memory at the same addresses, "
          "bytes kept. The result is a staging buffer over those pages (data_ptr: the first "
          "whole page, the origin of row offsets); nothing may write them during the call")
      .def_property_readonly("agent_rows", [](PyClient& pc) { return pc.get().agent_rows(); })
      .def(
          "submit_retrieve_rows",
          [](PyClient& pc, const PyStaging& s, const std::vector<ChunkKey>& keys,
             const py::buffer& row_offsets, uint32_t row_bytes, uint32_t rows_per_chunk,
             uint32_t last_rows) {
            const py::buffer_info b = row_offsets.request();
            if (b.itemsize != 8 || b.ndim != 1 || (b.size > 1 && b.strides[0] != 8))
              throw std::invalid_argument(
                  "row_offsets must be a contiguous array of 64-bit offsets");
            const uint64_t want =
                keys.empty() ? 0 : (keys.size() - 1) * uint64_t{rows_per_chunk} + last_rows;
            if (keys.empty() || static_cast<uint64_t>(b.size) != want)
              throw std::invalid_argument(
                  "row_offsets must hold (len(keys) - 1) * rows_per_chunk "
                  "+ last_rows offsets");
            auto p = std::make_unique<PyPending>();
            p->st.resize(keys.size());
            check(
                pc.get().submit_retrieve_rows(s.s, keys.data(), static_cast<uint32_t>(keys.size()),
                                              static_cast<const uint64_t*>(b.ptr), row_bytes,
                                              rows_per_chunk, last_rows, p->st.data(), &p->ticket),
                "submit_retrieve_rows");
            return p;
          },
          py::arg("staging"), py::arg("keys"), py::arg("row_offsets"), py::arg("row_bytes"),
          py::arg("rows_per_chunk"), py::arg("last_rows"),
          "Starts a retrieve into rows of a shared map (share_memory): chunk i fills its rows "
          "in order; collect it with wait()")
      .def(
          "store",
          [](PyClient& pc, const PyStaging& s, const std::vector<ChunkKey>& keys,
             const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths) {
            return io_call(pc.get(), &Client::store, s, keys, offsets, lengths, "store");
          },
          py::arg("staging"), py::arg("keys"), py::arg("offsets"), py::arg("lengths"),
          "Stores regions of a staging buffer; a status name per key (raises "
          "AgentUnavailable when the agent did not answer)")
      .def(
          "retrieve",
          [](PyClient& pc, const PyStaging& s, const std::vector<ChunkKey>& keys,
             const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths) {
            return io_call(pc.get(), &Client::retrieve, s, keys, offsets, lengths, "retrieve");
          },
          py::arg("staging"), py::arg("keys"), py::arg("offsets"), py::arg("lengths"),
          "Retrieves chunks into regions of a staging buffer; a status name per key")
      .def(
          "lookup",
          [](PyClient& pc, const std::vector<ChunkKey>& keys, bool pin) {
            Client& c = pc.get();
            uint32_t hits = 0;
            Status st;
            {
              py::gil_scoped_release nogil;
              st = c.lookup(keys.data(), static_cast<uint32_t>(keys.size()), pin, &hits);
            }
            check(st, "lookup");
            return hits;
          },
          py::arg("keys"), py::arg("pin") = false,
          "Leading keys present (raises AgentUnavailable when the agent is away)")
      .def(
          "lookup_layers",
          [](PyClient& pc, const std::vector<std::vector<ChunkKey>>& layers, bool pin) {
            Client& c = pc.get();
            std::vector<ChunkKey> flat;
            const size_t per = layers.empty() ? 0 : layers[0].size();
            for (const auto& l : layers) {
              if (l.size() != per) throw std::invalid_argument("layers differ in key count");
              flat.insert(flat.end(), l.begin(), l.end());
            }
            std::vector<uint32_t> hits(layers.size());
            if (layers.empty()) return hits;
            Status st;
            {
              py::gil_scoped_release nogil;
              st = c.lookup_layers(flat.data(), static_cast<uint32_t>(per),
                                   static_cast<uint32_t>(layers.size()), pin, hits.data());
            }
            check(st, "lookup_layers");
            return hits;
          },
          py::arg("layers"), py::arg("pin") = false,
          "Leading keys present per layer (a list of key lists, one per layer), in one round "
          "trip (raises AgentUnavailable when the agent is away)")
      .def(
          "subscribe_events",
          [](PyClient& pc) { check(pc.get().subscribe_events(), "subscribe_events"); },
          "From now on the agent sends this client its event feed (chunks of its model "
          "stored, and removed from every tier); take_events() collects it")
      .def(
          "take_events",
          [](PyClient& pc) {
            Client& c = pc.get();
            std::vector<agent::ChunkEvent> evs;
            bool lost = false;
            Status st;
            {
              py::gil_scoped_release nogil;
              st = c.take_events(&evs, &lost);
            }
            if (st == Code::kBadState) throw std::runtime_error("take_events: subscribe first");
            py::list out;
            for (const agent::ChunkEvent& e : evs)
              out.append(py::make_tuple(e.key, e.present != 0));
            return py::make_tuple(out, lost);
          },
          "The events that arrived since the last call, [(ChunkKey, stored), ...], and "
          "whether some were lost (rebuild your view); never blocks")
      .def("stats",
           [](PyClient& pc) {
             Client& c = pc.get();
             std::string j;
             check(c.stats_json(&j), "stats");
             return j;
           })
      .def("connected", [](PyClient& pc) { return pc.c && pc.c->connected(); })
      .def(
          "contains",
          [](PyClient& pc, const std::vector<ChunkKey>& keys) {
            Client& c = pc.get();
            return keys_call(c, &Client::contains, keys, "contains");
          },
          py::arg("keys"), "SUCCESS or NOT_FOUND per key")
      .def(
          "remove",
          [](PyClient& pc, const std::vector<ChunkKey>& keys) {
            Client& c = pc.get();
            return keys_call(c, &Client::remove, keys, "remove");
          },
          py::arg("keys"), "Drops chunks (BAD_STATE for one in use); a status name per key")
      .def(
          "prefetch",
          [](PyClient& pc, const std::vector<ChunkKey>& keys) {
            Client& c = pc.get();
            return keys_call(c, &Client::prefetch, keys, "prefetch");
          },
          py::arg("keys"), "Brings disk-only chunks into memory ahead of a retrieve")
      .def(
          "unpin",
          [](PyClient& pc, const std::vector<ChunkKey>& keys) {
            Client& c = pc.get();
            py::gil_scoped_release nogil;
            check(c.unpin(keys.data(), static_cast<uint32_t>(keys.size())), "unpin");
          },
          py::arg("keys"), "Releases pins taken by lookup(pin=True)")
      .def(
          "clear",
          [](PyClient& pc) {
            Client& c = pc.get();
            uint64_t removed = 0;
            check(c.clear(&removed), "clear");
            return removed;
          },
          "Drops every chunk of this client's model not in use or pinned; returns how many")
      .def_property_readonly("max_staging_bytes",
                             [](PyClient& pc) { return pc.get().max_staging_bytes(); })
      .def(
          "submit_store",
          [](PyClient& pc, const PyStaging& s, const std::vector<ChunkKey>& keys,
             const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths) {
            return submit(pc.get(), &Client::submit_store, s, keys, offsets, lengths);
          },
          py::arg("staging"), py::arg("keys"), py::arg("offsets"), py::arg("lengths"),
          "Starts a store; collect it with wait()")
      .def(
          "submit_retrieve",
          [](PyClient& pc, const PyStaging& s, const std::vector<ChunkKey>& keys,
             const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths) {
            return submit(pc.get(), &Client::submit_retrieve, s, keys, offsets, lengths);
          },
          py::arg("staging"), py::arg("keys"), py::arg("offsets"), py::arg("lengths"),
          "Starts a retrieve; collect it with wait()")
      .def(
          "poll",
          [](PyClient& pc, PyPending& p) {
            Client& c = pc.get();
            if (p.collected) return true;
            bool done = false;
            // Not done yet is IN_PROGRESS, not an error; once done, the statuses
            // are in p (wait() hands them over) whatever the call's outcome.
            (void)c.poll(p.ticket, &done);
            if (done) p.collected = true;
            return done;
          },
          py::arg("pending"),
          "True once the operation has finished (never blocks); wait() then returns "
          "its statuses at once")
      .def(
          "wait",
          [](PyClient& pc, PyPending& p) {
            Client& c = pc.get();
            if (!p.collected) {
              Status st;
              {
                py::gil_scoped_release nogil;
                st = c.wait(p.ticket);
              }
              p.collected = true;
              if (st == Code::kTimeout || st == Code::kConnectionReset) check(st, "wait");
            }
            return names(p.st);
          },
          py::arg("pending"), "Blocks until the operation finishes; a status name per key")
      .def(
          "close", [](PyClient& pc) { pc.c.reset(); },
          "Ends the session (also on garbage collection); later calls raise");
  m.def("keys_from_block_ids", &keys_from_ids, py::arg("model"), py::arg("ids"),
        "Keys from prefix-chained block ids (vLLM block hashes, trace ids)");
}
