// The agent's batch I/O (agent.h): STORE, RETRIEVE and RETRIEVE_ROWS batches. A
// batch's entries are checked against the session's own exported memory, then
// submitted to the cache engine as its requests (and buffers) allow: a batch that
// finds none waits in stalled_, oldest first, and resumes as requests complete
// (backpressure, not failure). The reply carries one status per entry.
#include "agent/agent.h"

#include <cstring>
#include <string>

#include "agent/agent_batch.h"
#include "agent/agent_session.h"
#include "protocol/tenant_key.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

void Agent::op_done(void* arg, Status st) {
  auto* slot = static_cast<Batch::Slot*>(arg);
  Batch* b = slot->batch;
  Agent* a = b->agent;
  b->status[slot->index] = static_cast<uint8_t>(st.code());
  if (--b->remaining == 0) a->finish_batch(b);
  // The cache freed this request before calling back: a stalled batch goes on.
  a->resume_stalled();
}

// Batches that waited for cache requests, oldest first. Not re-entered: a
// completion the submission itself causes (a request that fails at once) only
// frees a request for the loop already running.
void Agent::resume_stalled() {
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
void Agent::submit_entries(Batch* b, bool fresh) {
  Session* s = b->session;
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
        ++counters_.stalled_batches;
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
  if (--b->remaining == 0) finish_batch(b);
}

// One entry of a store or retrieve, checked against what its session may name.
Status Agent::submit_entry(Session* s, Op op, const IoEntry& e, void* slot) {
  ChunkKey key;
  Status st = scope_key(s, e.key, &key);
  if (st == Code::kNotPermitted) ++counters_.not_permitted;
  if (!st.ok()) return st;
  if ((e.map_id & agent::kGpuMapBit) != 0) {  // the client's GPU memory
    DeviceRange r;
    st = gpu_->range(s->gpu, e.map_id, e.offset, e.length, &r);
    if (st == Code::kNotPermitted) ++counters_.not_permitted;
    if (!st.ok()) return st;
    return op == Op::kStore ? cache_->store_device(key, r, &Agent::op_done, slot)
                            : cache_->retrieve_device(key, r, &Agent::op_done, slot);
  }
  Mmap* m = s->conn->imported_map(e.map_id);
  Buf* buf = nullptr;
  if (m == nullptr) {
    ++counters_.not_permitted;
    return Code::kNotPermitted;  // not memory this client exported
  }
  if (e.length == 0 || e.offset > m->length() || e.length > m->length() - e.offset)
    return Code::kInvalidValue;
  if (e.length > opts_.cache.max_chunk_bytes && op == Op::kStore) return Code::kTooBig;
  st = op == Op::kStore ? inv_->get_by_data(m, m->addr() + e.offset, e.length, &buf)
                        : inv_->get_by_addr(m, m->addr() + e.offset, e.length, &buf);
  if (!st.ok()) return st;
  st = op == Op::kStore ? cache_->store(key, buf, &Agent::op_done, slot)
                        : cache_->retrieve(key, buf, &Agent::op_done, slot);
  (void)buf->dec_refcount();  // the cache holds its own reference
  return st;
}

// A cache request, and buffers for a chunk's rows, are free.
bool Agent::can_submit() const {
  return cache_->requests_free() > 0 && inv_->num_free() >= agent::kMaxRowsPerChunk;
}

// One chunk of a RETRIEVE_ROWS batch: its rows, checked against the map the session
// exported, chained into one destination list.
Status Agent::submit_rows_entry(Session* s, const Batch& b, const IoEntry& e, void* slot) {
  ChunkKey key;
  Status st = scope_key(s, e.key, &key);
  if (st == Code::kNotPermitted) ++counters_.not_permitted;
  if (!st.ok()) return st;
  if ((e.map_id & agent::kGpuMapBit) != 0) return Code::kNotSupported;  // host memory only
  Mmap* m = s->conn->imported_map(e.map_id);
  if (m == nullptr) {
    ++counters_.not_permitted;
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
      st = inv_->get_by_addr(m, m->addr() + off, row, &buf);
      if (st.ok() && head != nullptr) st = buf_chain_list(head, buf);
    }
    if (!st.ok()) {
      if (buf != nullptr && buf != head) (void)buf->dec_refcount();
      if (head != nullptr) (void)head->dec_refcount();
      return st;
    }
    if (head == nullptr) head = buf;
  }
  st = cache_->retrieve(key, head, &Agent::op_done, slot);
  (void)head->dec_refcount();  // the cache holds its own reference
  return st;
}

void Agent::finish_batch(Batch* b) {
  Session* s = b->session;
  const double secs = (monotonic_ns() - b->start_ns) / 1e9;
  if (static_cast<Op>(b->hdr.op) == Op::kStore) latencies_.store.add(secs);
  if (static_cast<Op>(b->hdr.op) == Op::kRetrieve || b->rows) latencies_.retrieve.add(secs);
  Status worst;
  for (uint32_t i = 0; i < b->hdr.count; ++i)
    if (b->status[i] != 0) worst = static_cast<Code>(b->status[i]);
  reply(s, b->hdr, worst, b->status.data(), b->hdr.count);
  --s->pending;
  free_batches_.push_back(b);
  release_session(s);
}

void Agent::on_io(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  if (free_batches_.empty()) {
    reply(s, h, Code::kAgain, nullptr, 0);
    return;
  }
  Batch* b = free_batches_.back();
  free_batches_.pop_back();
  b->session = s;
  b->hdr = h;
  b->remaining = h.count + 1;  // +1 until every entry is submitted
  b->next = 0;
  b->start_ns = monotonic_ns();
  b->rows = false;
  b->entries.resize(h.count);  // within the capacity reserved at start: no allocation
  std::memcpy(b->entries.data(), body, h.count * sizeof(IoEntry));
  ++s->pending;
  submit_entries(b, /*fresh=*/true);
}

// A retrieve whose chunks land in rows of a map (a paged KV cache's blocks, shared
// in place by the client): each chunk's rows are one scatter list, so its bytes
// move once, arena to blocks. The body was checked whole (rows_body); the offsets
// are checked against the map as each chunk is submitted.
void Agent::on_rows(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t len) {
  if (free_batches_.empty()) {
    reply(s, h, Code::kAgain, nullptr, 0);
    return;
  }
  Batch* b = free_batches_.back();
  free_batches_.pop_back();
  uint64_t rows = 0;
  (void)agent::rows_body_valid(h.count, body, len, &b->rows_hdr, &rows);
  b->session = s;
  b->hdr = h;
  b->hdr.op = static_cast<uint16_t>(Op::kRetrieveRows);
  b->remaining = h.count + 1;
  b->next = 0;
  b->start_ns = monotonic_ns();
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
  ++s->pending;
  submit_entries(b, /*fresh=*/true);
}

}  // namespace dpukv
