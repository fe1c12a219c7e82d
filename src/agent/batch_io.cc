#include "agent/batch_io.h"

#include <cstring>

#include "protocol/tenant_key.h"
#include "runtime/clock.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

struct BatchIo::Batch {
  AgentSession* session = nullptr;
  AgentHeader hdr{};
  uint32_t remaining = 0;
  uint64_t start_ns = 0;
  std::vector<uint8_t> status;  // one Code per entry
  // The request's entries, copied once out of the message (which is gone by the
  // time a batch that waited for cache requests goes on). [next, count) are not yet
  // submitted.
  std::vector<IoEntry> entries;
  uint32_t next = 0;
  // RETRIEVE_ROWS: the rows' offsets into the map rows_hdr names; entry i's rows
  // are row_offsets[entries[i].offset, + entries[i].length). Grows once to the
  // largest such message a batch has carried, then is reused.
  bool rows = false;
  agent::RowsHeader rows_hdr{};
  std::vector<uint64_t> row_offsets;
  std::vector<Slot> slots;  // the cache's callback argument, one per entry
  BatchIo* io = nullptr;
};

BatchIo::BatchIo(Host* host, const Parts& p, uint32_t max_batches, uint32_t max_entries)
    : host_(host), parts_(p) {
  for (uint32_t i = 0; i < max_batches; ++i) {
    batches_.push_back(std::make_unique<Batch>());
    Batch* b = batches_.back().get();
    b->io = this;
    b->status.resize(max_entries);
    b->entries.reserve(max_entries);
    b->slots.resize(max_entries);
    for (uint32_t k = 0; k < max_entries; ++k) b->slots[k] = {b, k};
    free_.push_back(b);
  }
}

BatchIo::~BatchIo() = default;

uint8_t* BatchIo::spare_status(uint32_t n) {
  if (free_.empty() || free_.back()->status.size() < n) return nullptr;
  return free_.back()->status.data();
}

void BatchIo::op_done(void* arg, Status st) {
  auto* slot = static_cast<Slot*>(arg);
  Batch* b = slot->batch;
  BatchIo* io = b->io;
  b->status[slot->index] = static_cast<uint8_t>(st.code());
  if (--b->remaining == 0) io->finish(b);
  // The cache freed this request before calling back: a stalled batch goes on.
  io->resume_stalled();
}

// Batches that waited for cache requests, oldest first. Not re-entered: a
// completion the submission itself causes (a request that fails at once) only
// frees a request for the loop already running.
void BatchIo::resume_stalled() {
  if (resuming_) return;
  resuming_ = true;
  while (!stalled_.empty() && can_submit()) {
    Batch* b = stalled_.front();
    stalled_.pop_front();
    submit_entries(b, /*fresh=*/false);
  }
  resuming_ = false;
}

// Submits a store or retrieve batch's entries from b->next on (fresh: the batch
// just arrived). A burst beyond the cache's request pool (a 32k-token prefix is
// 4,096 chunks) waits for requests to finish rather than failing entries with
// AGAIN: backpressure, as a DOCA task pool gives it.
void BatchIo::submit_entries(Batch* b, bool fresh) {
  AgentSession* s = b->session;
  const Op op = static_cast<Op>(b->hdr.op);
  for (; b->next < b->hdr.count; ++b->next) {
    const uint32_t i = b->next;
    const IoEntry& e = b->entries[i];
    if (s->gone) {  // its GPU memory is closed and nobody reads the answer
      b->status[i] = static_cast<uint8_t>(Code::kConnectionReset);
      --b->remaining;
      continue;
    }
    // A new batch also waits behind batches already waiting: first come, first served.
    if (!can_submit() || (fresh && !stalled_.empty())) {
      if (fresh) {
        ++parts_.counters->stalled_batches;
        stalled_.push_back(b);
      } else {
        stalled_.push_front(b);  // resumed and out of requests again: still the oldest
      }
      return;
    }
    const Status st =
        b->rows ? submit_rows_entry(s, *b, e, &b->slots[i]) : submit_entry(s, op, e, &b->slots[i]);
    if (st.ok()) continue;  // completes through op_done
    b->status[i] = static_cast<uint8_t>(st.code());
    --b->remaining;
  }
  if (--b->remaining == 0) finish(b);
}

// One entry of a store or retrieve, checked against what its session may name.
Status BatchIo::submit_entry(AgentSession* s, Op op, const IoEntry& e, void* slot) {
  ChunkKey key;
  Status st = scope_key(s, e.key, &key);
  if (st == Code::kNotPermitted) ++parts_.counters->not_permitted;
  if (!st.ok()) return st;
  if ((e.map_id & agent::kGpuMapBit) != 0) {  // the client's GPU memory
    DeviceRange r;
    st = parts_.gpu->range(s->gpu, e.map_id, e.offset, e.length, &r);
    if (st == Code::kNotPermitted) ++parts_.counters->not_permitted;
    if (!st.ok()) return st;
    return op == Op::kStore ? parts_.cache->store_device(key, r, &BatchIo::op_done, slot)
                            : parts_.cache->retrieve_device(key, r, &BatchIo::op_done, slot);
  }
  Mmap* m = s->conn->imported_map(e.map_id);
  Buf* buf = nullptr;
  if (m == nullptr) {
    ++parts_.counters->not_permitted;
    return Code::kNotPermitted;  // not memory this client exported
  }
  if (e.length == 0 || e.offset > m->length() || e.length > m->length() - e.offset)
    return Code::kInvalidValue;
  if (e.length > parts_.max_chunk_bytes && op == Op::kStore) return Code::kTooBig;
  st = op == Op::kStore ? parts_.inv->get_by_data(m, m->addr() + e.offset, e.length, &buf)
                        : parts_.inv->get_by_addr(m, m->addr() + e.offset, e.length, &buf);
  if (!st.ok()) return st;
  st = op == Op::kStore ? parts_.cache->store(key, buf, &BatchIo::op_done, slot)
                        : parts_.cache->retrieve(key, buf, &BatchIo::op_done, slot);
  (void)buf->dec_refcount();  // the cache holds its own reference
  return st;
}

// A cache request, and buffers for a chunk's rows, are free.
bool BatchIo::can_submit() const {
  return parts_.cache->requests_free() > 0 && parts_.inv->num_free() >= agent::kMaxRowsPerChunk;
}

// One chunk of a RETRIEVE_ROWS batch: its rows, checked against the map the session
// exported, chained into one destination list.
Status BatchIo::submit_rows_entry(AgentSession* s, const Batch& b, const IoEntry& e, void* slot) {
  ChunkKey key;
  Status st = scope_key(s, e.key, &key);
  if (st == Code::kNotPermitted) ++parts_.counters->not_permitted;
  if (!st.ok()) return st;
  if ((e.map_id & agent::kGpuMapBit) != 0) return Code::kNotSupported;  // host memory only
  Mmap* m = s->conn->imported_map(e.map_id);
  if (m == nullptr) {
    ++parts_.counters->not_permitted;
    return Code::kNotPermitted;
  }
  const uint64_t row = b.rows_hdr.row_bytes;
  Buf* head = nullptr;
  for (uint64_t r = e.offset; r < e.offset + e.length; ++r) {
    const uint64_t off = b.row_offsets[r];
    Buf* buf = nullptr;
    if (off > m->length() || row > m->length() - off) {
      st = Code::kInvalidValue;
    } else {
      st = parts_.inv->get_by_addr(m, m->addr() + off, row, &buf);
      if (st.ok() && head != nullptr) st = buf_chain_list(head, buf);
    }
    if (!st.ok()) {
      if (buf != nullptr && buf != head) (void)buf->dec_refcount();
      if (head != nullptr) (void)head->dec_refcount();
      return st;
    }
    if (head == nullptr) head = buf;
  }
  st = parts_.cache->retrieve(key, head, &BatchIo::op_done, slot);
  (void)head->dec_refcount();  // the cache holds its own reference
  return st;
}

void BatchIo::finish(Batch* b) {
  AgentSession* s = b->session;
  const double secs = (monotonic_ns() - b->start_ns) / 1e9;
  if (static_cast<Op>(b->hdr.op) == Op::kStore) parts_.latencies->store.add(secs);
  if (static_cast<Op>(b->hdr.op) == Op::kRetrieve || b->rows) parts_.latencies->retrieve.add(secs);
  Status worst;
  for (uint32_t i = 0; i < b->hdr.count; ++i)
    if (b->status[i] != 0) worst = static_cast<Code>(b->status[i]);
  host_->reply(s, b->hdr, worst, b->status.data(), b->hdr.count);
  --s->pending;
  free_.push_back(b);
  host_->release_session(s);
}

// A free batch for h from s (null: none), its counts reset, the session held.
BatchIo::Batch* BatchIo::take(AgentSession* s, const AgentHeader& h) {
  if (free_.empty()) return nullptr;
  Batch* b = free_.back();
  free_.pop_back();
  b->session = s;
  b->hdr = h;
  b->remaining = h.count + 1;  // +1 until every entry is submitted
  b->next = 0;
  b->start_ns = monotonic_ns();
  ++s->pending;
  return b;
}

Status BatchIo::start(AgentSession* s, const AgentHeader& h, const uint8_t* body) {
  Batch* b = take(s, h);
  if (b == nullptr) return Code::kAgain;
  b->rows = false;
  b->entries.resize(h.count);  // within the capacity reserved at start: no allocation
  std::memcpy(b->entries.data(), body, h.count * sizeof(IoEntry));
  submit_entries(b, /*fresh=*/true);
  return Code::kSuccess;
}

Status BatchIo::start_rows(AgentSession* s, const AgentHeader& h, const uint8_t* body,
                           uint32_t len) {
  Batch* b = take(s, h);
  if (b == nullptr) return Code::kAgain;
  uint64_t rows = 0;
  (void)agent::rows_body_valid(h.count, body, len, &b->rows_hdr, &rows);
  b->hdr.op = static_cast<uint16_t>(Op::kRetrieveRows);
  b->rows = true;
  const uint8_t* keys = body + sizeof(agent::RowsHeader);
  b->row_offsets.resize(rows);
  std::memcpy(b->row_offsets.data(), keys + static_cast<size_t>(h.count) * sizeof(ChunkKey),
              rows * sizeof(uint64_t));
  b->entries.resize(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    IoEntry& e = b->entries[i];
    std::memcpy(&e.key, keys + static_cast<size_t>(i) * sizeof(ChunkKey), sizeof(ChunkKey));
    e.map_id = b->rows_hdr.map_id;
    e.offset = static_cast<uint64_t>(i) * b->rows_hdr.rows_per_chunk;  // first row
    e.length = i + 1 == h.count ? b->rows_hdr.last_rows : b->rows_hdr.rows_per_chunk;
  }
  submit_entries(b, /*fresh=*/true);
  return Code::kSuccess;
}

}  // namespace dpukv
