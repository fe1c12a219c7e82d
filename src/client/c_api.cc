// The C ABI over dpukv::Client: no exceptions cross it; every error is a status.
#include "dpukv/client.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "client/client.h"
#include "engines/compress/kv_codec.h"

static_assert(sizeof(dpukv_event) == sizeof(dpukv::agent::ChunkEvent));
static_assert(offsetof(dpukv_event, tenant) == offsetof(dpukv::agent::ChunkEvent, tenant));

struct dpukv_client {
  std::unique_ptr<dpukv::Client> c;
  std::vector<dpukv::agent::ChunkEvent> events;  // taken from the client, not handed over
  bool events_lost = false;
  std::vector<dpukv::Staging> staging;  // host and GPU (a GPU one has no data)
  std::vector<dpukv::GpuStaging> gpu;
  struct Submitted {  // an asynchronous call: its statuses until dpukv_wait
    uint64_t ticket;
    std::vector<dpukv::Status> st;
    int* out;
  };
  std::vector<std::unique_ptr<Submitted>> submitted;
};

static_assert(sizeof(dpukv_key) == sizeof(dpukv::ChunkKey));

namespace {
const dpukv::ChunkKey* keys_of(const dpukv_key* k) {
  return reinterpret_cast<const dpukv::ChunkKey*>(k);
}
int code(dpukv::Status s) {
  return static_cast<int>(s.code());
}

const dpukv::Staging* staging_of(dpukv_client* c, uint64_t id) {
  for (const auto& x : c->staging)
    if (x.id == id) return &x;
  return nullptr;
}

int io(dpukv_client* c, bool store, uint64_t staging_id, const dpukv_key* keys,
       const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry) {
  if (c == nullptr || keys == nullptr || offsets == nullptr || lengths == nullptr)
    return code(dpukv::Code::kInvalidValue);
  const dpukv::Staging* s = staging_of(c, staging_id);
  if (s == nullptr) return code(dpukv::Code::kNotFound);
  std::vector<dpukv::Status> st(n);
  dpukv::Status r = store ? c->c->store(*s, keys_of(keys), offsets, lengths, n, st.data())
                          : c->c->retrieve(*s, keys_of(keys), offsets, lengths, n, st.data());
  if (per_entry)
    for (uint32_t i = 0; i < n; ++i) per_entry[i] = code(st[i]);
  return code(r);
}
// An asynchronous call's statuses kept until dpukv_wait: start(st, &ticket) submits.
template <typename Start>
int track(dpukv_client* c, uint32_t n, int* per_entry, uint64_t* ticket, Start start) {
  auto x = std::make_unique<dpukv_client::Submitted>();
  x->st.resize(n);
  x->out = per_entry;
  const dpukv::Status r = start(x->st.data(), &x->ticket);
  if (!r.ok()) return code(r);
  *ticket = x->ticket;
  c->submitted.push_back(std::move(x));
  return 0;
}
int submit(dpukv_client* c, bool store, uint64_t staging_id, const dpukv_key* keys,
           const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry,
           uint64_t* ticket) {
  if (c == nullptr || keys == nullptr || offsets == nullptr || lengths == nullptr ||
      per_entry == nullptr || ticket == nullptr || n == 0)
    return code(dpukv::Code::kInvalidValue);
  const dpukv::Staging* s = staging_of(c, staging_id);
  if (s == nullptr) return code(dpukv::Code::kNotFound);
  return track(c, n, per_entry, ticket, [&](dpukv::Status* st, uint64_t* t) {
    return store ? c->c->submit_store(*s, keys_of(keys), offsets, lengths, n, st, t)
                 : c->c->submit_retrieve(*s, keys_of(keys), offsets, lengths, n, st, t);
  });
}

bool kv_codec_of(int codec, dpukv::KvCodec* out) {
  switch (codec) {
    case DPUKV_KV_LOSSLESS:
      *out = dpukv::KvCodec::kLosslessDelta;
      return true;
    case DPUKV_KV_INT8:
      *out = dpukv::KvCodec::kInt8;
      return true;
    case DPUKV_KV_INT4:
      *out = dpukv::KvCodec::kInt4;
      return true;
  }
  return false;
}
// Sized once per thread to its largest chunk: no allocation per chunk after that.
dpukv::KvScratch& kv_scratch(size_t bytes) {
  thread_local dpukv::KvScratch s;
  if (s.capacity() < bytes) s.reserve(bytes);
  return s;
}
}  // namespace

extern "C" {

namespace {

int connect_with(const char* socket, uint64_t model, bool absent_ok, dpukv_client** out) {
  if (out == nullptr) return code(dpukv::Code::kInvalidValue);
  auto* h = new (std::nothrow) dpukv_client();
  if (h == nullptr) return code(dpukv::Code::kNoMemory);
  dpukv::ClientOptions o;
  if (socket) o.socket_path = socket;
  o.model = model;
  o.absent_ok = absent_ok;
  dpukv::Status st = dpukv::Client::connect(o, &h->c);
  if (!st.ok()) {
    delete h;
    return code(st);
  }
  *out = h;
  return 0;
}

}  // namespace

const char* dpukv_last_connect_error(void) {
  return dpukv::Client::last_connect_error();
}

int dpukv_connect(const char* socket, uint64_t model, dpukv_client** out) {
  return connect_with(socket, model, false, out);
}

int dpukv_connect_absent_ok(const char* socket, uint64_t model, dpukv_client** out) {
  return connect_with(socket, model, true, out);
}

int dpukv_connected(dpukv_client* c) {
  return c != nullptr && c->c->connected() ? 1 : 0;
}

void dpukv_close(dpukv_client* c) {
  delete c;
}

const char* dpukv_status_name(int status) {
  return dpukv::code_name(static_cast<dpukv::Code>(status)).data();  // names are literals
}

int dpukv_alloc_staging(dpukv_client* c, size_t bytes, void** data, uint64_t* staging_id) {
  if (c == nullptr || data == nullptr || staging_id == nullptr)
    return code(dpukv::Code::kInvalidValue);
  dpukv::Staging s;
  dpukv::Status st = c->c->alloc_staging(bytes, &s);
  if (!st.ok()) return code(st);
  c->staging.push_back(s);
  *data = s.data;
  *staging_id = s.id;
  return 0;
}

int dpukv_share_memory(dpukv_client* c, void* addr, size_t bytes, void** data, uint64_t* size,
                       uint64_t* staging_id) {
  if (c == nullptr || data == nullptr || size == nullptr || staging_id == nullptr)
    return code(dpukv::Code::kInvalidValue);
  dpukv::Staging s;
  dpukv::Status st = c->c->share_memory(addr, bytes, &s);
  if (!st.ok()) return code(st);
  c->staging.push_back(s);
  *data = s.data;
  *size = s.size;
  *staging_id = s.id;
  return 0;
}

int dpukv_agent_rows(dpukv_client* c) {
  return c != nullptr && c->c->agent_rows() ? 1 : 0;
}

int dpukv_export_gpu(dpukv_client* c, uint64_t device_ptr, size_t bytes, int device,
                     uint64_t* staging_id) {
  if (c == nullptr || staging_id == nullptr) return code(dpukv::Code::kInvalidValue);
  dpukv::GpuStaging g;
  std::string why;
  dpukv::Status st = c->c->export_gpu(device_ptr, bytes, device, &g, &why);
  if (!st.ok()) return code(st);
  c->gpu.push_back(g);
  c->staging.push_back(g.staging());
  *staging_id = g.id;
  return 0;
}

int dpukv_agent_gpu(dpukv_client* c) {
  return c != nullptr && c->c->agent_gpu() ? 1 : 0;
}

int dpukv_release_gpu(dpukv_client* c, uint64_t staging_id) {
  if (c == nullptr) return code(dpukv::Code::kInvalidValue);
  for (size_t i = 0; i < c->gpu.size(); ++i) {
    if (c->gpu[i].id != staging_id) continue;
    dpukv::Status st = c->c->release_gpu(c->gpu[i]);
    c->gpu.erase(c->gpu.begin() + static_cast<long>(i));
    for (size_t k = 0; k < c->staging.size(); ++k) {
      if (c->staging[k].id != staging_id) continue;
      c->staging.erase(c->staging.begin() + static_cast<long>(k));
      break;
    }
    return code(st);
  }
  return code(dpukv::Code::kNotFound);
}

int dpukv_store(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry) {
  return io(c, true, staging_id, keys, offsets, lengths, n, per_entry);
}

int dpukv_retrieve(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                   const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry) {
  return io(c, false, staging_id, keys, offsets, lengths, n, per_entry);
}

uint32_t dpukv_lookup(dpukv_client* c, const dpukv_key* keys, uint32_t n, int pin) {
  if (c == nullptr || keys == nullptr) return 0;
  return c->c->lookup(keys_of(keys), n, pin != 0);
}

int dpukv_lookup_status(dpukv_client* c, const dpukv_key* keys, uint32_t n, int pin,
                        uint32_t* hits) {
  if (c == nullptr || keys == nullptr || hits == nullptr) return code(dpukv::Code::kInvalidValue);
  return code(c->c->lookup(keys_of(keys), n, pin != 0, hits));
}

int dpukv_lookup_layers(dpukv_client* c, const dpukv_key* keys, uint32_t per_layer, uint32_t layers,
                        int pin, uint32_t* hits) {
  if (c == nullptr || keys == nullptr || hits == nullptr) return code(dpukv::Code::kInvalidValue);
  return code(c->c->lookup_layers(keys_of(keys), per_layer, layers, pin != 0, hits));
}

int dpukv_unpin(dpukv_client* c, const dpukv_key* keys, uint32_t n) {
  if (c == nullptr || keys == nullptr) return code(dpukv::Code::kInvalidValue);
  return code(c->c->unpin(keys_of(keys), n));
}

namespace {
using KeysCall = dpukv::Status (dpukv::Client::*)(const dpukv::ChunkKey*, uint32_t, dpukv::Status*,
                                                  dpukv::Status*);
int per_key(dpukv_client* c, KeysCall fn, const dpukv_key* keys, uint32_t n, int* per_entry) {
  if (c == nullptr || keys == nullptr) return code(dpukv::Code::kInvalidValue);
  std::vector<dpukv::Status> st(n);
  dpukv::Status call;
  (void)(c->c.get()->*fn)(keys_of(keys), n, st.data(), &call);
  if (per_entry != nullptr)
    for (uint32_t i = 0; i < n; ++i) per_entry[i] = code(st[i]);
  return code(call);  // the call's own (transport) status; the keys' are per_entry's
}
}  // namespace

int dpukv_remove(dpukv_client* c, const dpukv_key* keys, uint32_t n, int* per_entry) {
  return per_key(c, &dpukv::Client::remove, keys, n, per_entry);
}

int dpukv_contains(dpukv_client* c, const dpukv_key* keys, uint32_t n, int* per_entry) {
  return per_key(c, &dpukv::Client::contains, keys, n, per_entry);
}

int dpukv_prefetch(dpukv_client* c, const dpukv_key* keys, uint32_t n, int* per_entry) {
  return per_key(c, &dpukv::Client::prefetch, keys, n, per_entry);
}

uint64_t dpukv_max_staging_bytes(dpukv_client* c) {
  return c == nullptr ? 0 : c->c->max_staging_bytes();
}

uint32_t dpukv_keys_from_block_ids(uint64_t model, const uint64_t* ids, uint32_t n,
                                   dpukv_key* out) {
  if (ids == nullptr || out == nullptr) return 0;
  for (uint32_t i = 0; i < n; ++i) {
    const dpukv::ChunkKey k = dpukv::key_from_block_id(dpukv::KeyContext{model, 1, 0, 0}, ids[i]);
    std::memcpy(&out[i], &k, sizeof(k));
  }
  return n;
}

int dpukv_clear(dpukv_client* c, uint64_t* removed) {
  if (c == nullptr || removed == nullptr) return code(dpukv::Code::kInvalidValue);
  return code(c->c->clear(removed));
}

int dpukv_stats_json(dpukv_client* c, char* buf, size_t cap, size_t* len) {
  if (c == nullptr || (buf == nullptr && cap != 0)) return code(dpukv::Code::kInvalidValue);
  std::string j;
  const dpukv::Status st = c->c->stats_json(&j);
  if (!st.ok()) return code(st);
  if (len != nullptr) *len = j.size();
  if (j.size() + 1 > cap) return code(dpukv::Code::kTooBig);
  std::memcpy(buf, j.c_str(), j.size() + 1);
  return 0;
}

int dpukv_subscribe_events(dpukv_client* c) {
  if (c == nullptr) return code(dpukv::Code::kInvalidValue);
  return code(c->c->subscribe_events());
}

int dpukv_take_events(dpukv_client* c, dpukv_event* out, uint32_t max, uint32_t* n, int* lost) {
  if (c == nullptr || (out == nullptr && max != 0) || n == nullptr)
    return code(dpukv::Code::kInvalidValue);
  std::vector<dpukv::agent::ChunkEvent> more;
  bool l = false;
  const dpukv::Status st = c->c->take_events(&more, &l);
  if (st == dpukv::Code::kBadState) return code(st);  // not subscribed
  c->events.insert(c->events.end(), more.begin(), more.end());
  c->events_lost = c->events_lost || l;
  const uint32_t k = static_cast<uint32_t>(std::min<size_t>(max, c->events.size()));
  if (k != 0) std::memcpy(out, c->events.data(), k * sizeof(dpukv_event));
  c->events.erase(c->events.begin(), c->events.begin() + k);
  *n = k;
  if (lost != nullptr) *lost = c->events_lost ? 1 : 0;
  c->events_lost = false;
  return 0;
}

int dpukv_submit_store(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                       const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry,
                       uint64_t* ticket) {
  return submit(c, true, staging_id, keys, offsets, lengths, n, per_entry, ticket);
}

int dpukv_submit_retrieve(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                          const uint64_t* offsets, const uint64_t* lengths, uint32_t n,
                          int* per_entry, uint64_t* ticket) {
  return submit(c, false, staging_id, keys, offsets, lengths, n, per_entry, ticket);
}

int dpukv_submit_retrieve_rows(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                               uint32_t n, const uint64_t* row_offsets, uint32_t row_bytes,
                               uint32_t rows_per_chunk, uint32_t last_rows, int* per_entry,
                               uint64_t* ticket) {
  if (c == nullptr || keys == nullptr || row_offsets == nullptr || per_entry == nullptr ||
      ticket == nullptr || n == 0)
    return code(dpukv::Code::kInvalidValue);
  const dpukv::Staging* s = staging_of(c, staging_id);
  if (s == nullptr) return code(dpukv::Code::kNotFound);
  return track(c, n, per_entry, ticket, [&](dpukv::Status* st, uint64_t* t) {
    return c->c->submit_retrieve_rows(*s, keys_of(keys), n, row_offsets, row_bytes, rows_per_chunk,
                                      last_rows, st, t);
  });
}

int dpukv_wait(dpukv_client* c, uint64_t ticket) {
  if (c == nullptr) return code(dpukv::Code::kInvalidValue);
  for (size_t i = 0; i < c->submitted.size(); ++i) {
    dpukv_client::Submitted& x = *c->submitted[i];
    if (x.ticket != ticket) continue;
    const dpukv::Status st = c->c->wait(ticket);
    for (size_t k = 0; k < x.st.size(); ++k) x.out[k] = code(x.st[k]);
    c->submitted.erase(c->submitted.begin() + static_cast<long>(i));
    return code(st);
  }
  return code(dpukv::Code::kNotFound);
}

int dpukv_poll(dpukv_client* c, uint64_t ticket, int* done) {
  if (c == nullptr || done == nullptr) return code(dpukv::Code::kInvalidValue);
  *done = 0;
  for (size_t i = 0; i < c->submitted.size(); ++i) {
    dpukv_client::Submitted& x = *c->submitted[i];
    if (x.ticket != ticket) continue;
    bool finished = false;
    const dpukv::Status st = c->c->poll(ticket, &finished);
    if (!finished) return code(dpukv::Code::kInProgress);
    for (size_t k = 0; k < x.st.size(); ++k) x.out[k] = code(x.st[k]);
    c->submitted.erase(c->submitted.begin() + static_cast<long>(i));
    *done = 1;
    return code(st);
  }
  return code(dpukv::Code::kNotFound);
}

int dpukv_push(dpukv_client* c, uint64_t node, const dpukv_key* keys, uint32_t n, int* per_entry) {
  if (c == nullptr || keys == nullptr || n == 0 || n > dpukv::agent::kMaxPushKeys)
    return code(dpukv::Code::kInvalidValue);
  std::vector<dpukv::Status> st(n);
  const dpukv::Status r = c->c->push(node, keys_of(keys), n, st.data());
  if (per_entry != nullptr)
    for (uint32_t i = 0; i < n; ++i) per_entry[i] = code(st[i]);
  return code(r);
}

uint32_t dpukv_chunk_keys(uint64_t model, uint32_t world_size, uint32_t rank, uint64_t layout,
                          const int32_t* tokens, size_t n_tokens, uint32_t chunk_tokens,
                          int include_partial, dpukv_key* out, uint32_t max_keys) {
  if (tokens == nullptr || out == nullptr) return 0;
  std::vector<dpukv::ChunkKey> ks;
  dpukv::chunk_keys(dpukv::KeyContext{model, world_size, rank, layout}, tokens, n_tokens,
                    chunk_tokens, include_partial != 0, &ks);
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(ks.size(), max_keys));
  std::memcpy(out, ks.data(), n * sizeof(dpukv_key));
  return n;
}

uint32_t dpukv_chunk_keys_layers(uint64_t model, uint32_t world_size, uint32_t rank,
                                 const uint64_t* layouts, uint32_t n_layouts, const int32_t* tokens,
                                 size_t n_tokens, uint32_t chunk_tokens, int include_partial,
                                 dpukv_key* out, uint32_t max_keys) {
  if (layouts == nullptr || n_layouts == 0) return 0;
  const uint32_t n = dpukv_chunk_keys(model, world_size, rank, layouts[0], tokens, n_tokens,
                                      chunk_tokens, include_partial, out, max_keys);
  for (uint32_t l = 1; l < n_layouts; ++l) {
    dpukv_key* row = out + static_cast<size_t>(l) * max_keys;
    std::memcpy(row, out, n * sizeof(dpukv_key));
    for (uint32_t i = 0; i < n; ++i) row[i].layout = layouts[l];
  }
  return n;
}

uint64_t dpukv_model_id(const char* model_name) {
  return model_name ? dpukv::model_id(model_name) : 0;
}

uint64_t dpukv_kv_layout_fingerprint(const char* dtype, uint32_t layers, uint32_t kv_heads,
                                     uint32_t head_dim) {
  return dtype ? dpukv::kv_layout_fingerprint(dtype, layers, kv_heads, head_dim) : 0;
}

size_t dpukv_kv_encode_bound(int codec, uint32_t slabs, uint32_t tokens, uint32_t channels,
                             uint32_t flags, size_t len) {
  dpukv::KvCodecParams p;
  if (!kv_codec_of(codec, &p.codec) || flags > DPUKV_KV_VALUES_PER_TOKEN) return 0;
  p.shape = {slabs, tokens, channels};
  p.flags = static_cast<uint8_t>(flags);
  return dpukv::kv_encode_bound(p, len);
}

int dpukv_kv_encode(int codec, int dtype, uint32_t slabs, uint32_t tokens, uint32_t channels,
                    uint32_t flags, const void* src, size_t len, void* dst, size_t cap,
                    size_t* out_len) {
  dpukv::KvCodecParams p;
  if (!kv_codec_of(codec, &p.codec) || (dtype != DPUKV_KV_BF16 && dtype != DPUKV_KV_FP16) ||
      flags > DPUKV_KV_VALUES_PER_TOKEN || src == nullptr || dst == nullptr || out_len == nullptr)
    return code(dpukv::Code::kInvalidValue);
  p.dtype = static_cast<dpukv::KvDtype>(dtype);
  p.shape = {slabs, tokens, channels};
  p.flags = static_cast<uint8_t>(flags);
  return code(dpukv::kv_encode(p, static_cast<const uint8_t*>(src), len, static_cast<uint8_t*>(dst),
                               cap, &kv_scratch(len), out_len, nullptr));
}

int dpukv_kv_decode_rows(const void* base, const uint64_t* offsets, const uint64_t* caps,
                         uint32_t n, void* const* rows, uint32_t rows_per_chunk, uint32_t last_rows,
                         uint64_t row_bytes, int* per_entry) {
  if (n == 0) return code(dpukv::Code::kSuccess);
  if (base == nullptr || offsets == nullptr || caps == nullptr || rows == nullptr ||
      per_entry == nullptr || rows_per_chunk == 0 || last_rows == 0 || row_bytes == 0)
    return code(dpukv::Code::kInvalidValue);
  const auto* b = static_cast<const uint8_t*>(base);
  auto* const* r = reinterpret_cast<uint8_t* const*>(rows);
  dpukv::KvScratch& scratch = kv_scratch(static_cast<size_t>(rows_per_chunk) * row_bytes);
  int first = code(dpukv::Code::kSuccess);
  for (uint32_t i = 0; i < n; ++i) {
    const size_t nrows = i + 1 == n ? last_rows : rows_per_chunk;
    size_t len = 0, out = 0;
    dpukv::Status st = dpukv::kv_encoded_length(b + offsets[i], caps[i], &len);
    if (st.ok())
      st = dpukv::kv_decode_rows(b + offsets[i], len, r + static_cast<size_t>(i) * rows_per_chunk,
                                 nrows, row_bytes, &scratch, &out);
    per_entry[i] = code(st);
    if (!st.ok() && first == code(dpukv::Code::kSuccess)) first = per_entry[i];
  }
  return first;
}

}  // extern "C"
