// The client's batch I/O (client.h): STORE, RETRIEVE and RETRIEVE_ROWS, cut into
// messages of at most what the channel carries, submitted without waiting
// (tickets) and collected as the agent answers, each entry with its own status.
#include "client/client.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

namespace {
// The one batch splitter: cuts n IoEntries into messages of at most per_msg and
// calls send(base, entries, count) for each, in order, until it returns false.
template <typename Send>
void for_each_message(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                      const uint64_t* lengths, uint32_t n, uint32_t per_msg,
                      std::vector<IoEntry>* scratch, Send send) {
  for (uint32_t base = 0; base < n; base += per_msg) {
    const uint32_t k = std::min(per_msg, n - base);
    scratch->resize(k);
    for (uint32_t i = 0; i < k; ++i)
      (*scratch)[i] = IoEntry{keys[base + i], s.id, offsets[base + i], lengths[base + i]};
    if (!send(base, scratch->data(), k)) return;
  }
}
}  // namespace

Status Client::submit_io(Op op, const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                         const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out) {
  std::lock_guard<std::mutex> g(mu_);
  if (per_entry == nullptr || out == nullptr || n == 0) return Code::kInvalidValue;
  // Not answered yet: an entry never reads SUCCESS unless the agent said so.
  for (uint32_t i = 0; i < n; ++i) per_entry[i] = Code::kInProgress;
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  Pending p;
  p.ticket = next_ticket_++;
  p.per_entry = per_entry;
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(IoEntry);
  std::vector<IoEntry> es;
  for_each_message(s, keys, offsets, lengths, n, per_msg, &es,
                   [&](uint32_t base, const IoEntry* e, uint32_t k) {
                     uint64_t id;
                     Status st = send_request(op, 0, e, sizeof(IoEntry), k, &id);
                     if (!st.ok()) {
                       for (uint32_t i = base; i < n; ++i) per_entry[i] = st;
                       if (p.first.ok()) p.first = st;
                       return false;
                     }
                     p.ids.push_back(id);
                     p.bases.push_back(base);
                     p.counts.push_back(k);
                     return true;
                   });
  *out = p.ticket;
  pending_.push_back(std::move(p));
  return Code::kSuccess;
}

bool Client::collect(Ticket t) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Pending& p) { return p.ticket == t; });
  if (it == pending_.end()) return true;
  Pending& p = *it;
  for (size_t m = 0; m < p.ids.size(); ++m) {
    if (p.ids[m] == 0) continue;  // answered already
    auto r = std::find_if(responses_.begin(), responses_.end(),
                          [&](const auto& x) { return x.first == p.ids[m]; });
    if (r == responses_.end()) {
      if (lost_) {  // the answer will never come
        for (uint32_t i = 0; i < p.counts[m]; ++i)
          p.per_entry[p.bases[m] + i] = Code::kConnectionReset;
        if (p.first.ok()) p.first = Code::kConnectionReset;
        p.ids[m] = 0;
        ++p.answered;
      }
      continue;
    }
    const std::vector<uint8_t>& resp = r->second;
    for (uint32_t i = 0; i < p.counts[m]; ++i) {
      Status e = resp.size() >= sizeof(AgentHeader) + p.counts[m]
                     ? Status(static_cast<Code>(resp[sizeof(AgentHeader) + i]))
                     : Status(Code::kCorrupted);
      p.per_entry[p.bases[m] + i] = e;
      if (!e.ok() && p.first.ok()) p.first = e;
    }
    responses_.erase(r);
    p.ids[m] = 0;
    ++p.answered;
  }
  return p.answered == p.ids.size();
}

Status Client::submit_store(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                            const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out) {
  return submit_io(Op::kStore, s, keys, offsets, lengths, n, per_entry, out);
}

Status Client::submit_retrieve(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                               const uint64_t* lengths, uint32_t n, Status* per_entry,
                               Ticket* out) {
  return submit_io(Op::kRetrieve, s, keys, offsets, lengths, n, per_entry, out);
}

Status Client::submit_retrieve_rows(const Staging& s, const ChunkKey* keys, uint32_t n,
                                    const uint64_t* row_offsets, uint32_t row_bytes,
                                    uint32_t rows_per_chunk, uint32_t last_rows, Status* per_entry,
                                    Ticket* out) {
  std::lock_guard<std::mutex> g(mu_);
  if (per_entry == nullptr || out == nullptr || keys == nullptr || row_offsets == nullptr ||
      n == 0 || row_bytes == 0 || rows_per_chunk == 0 || rows_per_chunk > agent::kMaxRowsPerChunk ||
      last_rows == 0 || last_rows > rows_per_chunk)
    return Code::kInvalidValue;
  const uint64_t rows = static_cast<uint64_t>(n - 1) * rows_per_chunk + last_rows;
  for (uint64_t r = 0; r < rows; ++r)
    if (row_offsets[r] > s.size || row_bytes > s.size - row_offsets[r]) return Code::kInvalidValue;
  for (uint32_t i = 0; i < n; ++i) per_entry[i] = Code::kInProgress;
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  if (!agent_rows_) return Code::kNotSupported;
  Pending p;
  p.ticket = next_ticket_++;
  p.per_entry = per_entry;
  // Whole chunks per message: the header, then each chunk's key and row offsets.
  const uint32_t room =
      ch_->connection()->max_msg() - sizeof(AgentHeader) - sizeof(agent::RowsHeader);
  const uint32_t per_msg = room / (sizeof(ChunkKey) + rows_per_chunk * sizeof(uint64_t));
  std::vector<uint8_t> body;
  for (uint32_t base = 0; base < n; base += per_msg) {
    const uint32_t k = std::min(per_msg, n - base);
    const bool last = base + k == n;
    const agent::RowsHeader h{s.id, row_bytes, static_cast<uint16_t>(rows_per_chunk),
                              static_cast<uint16_t>(last ? last_rows : rows_per_chunk), 0};
    const uint64_t msg_rows = static_cast<uint64_t>(k - 1) * rows_per_chunk + h.last_rows;
    body.resize(sizeof(h) + k * sizeof(ChunkKey) + msg_rows * sizeof(uint64_t));
    std::memcpy(body.data(), &h, sizeof(h));
    std::memcpy(body.data() + sizeof(h), keys + base, k * sizeof(ChunkKey));
    std::memcpy(body.data() + sizeof(h) + k * sizeof(ChunkKey),
                row_offsets + static_cast<uint64_t>(base) * rows_per_chunk,
                msg_rows * sizeof(uint64_t));
    uint64_t id;
    const Status st = send_request(Op::kRetrieveRows, 0, body.data(), 1,
                                   static_cast<uint32_t>(body.size()), &id, k);
    if (!st.ok()) {
      for (uint32_t i = base; i < n; ++i) per_entry[i] = st;
      if (p.first.ok()) p.first = st;
      break;
    }
    p.ids.push_back(id);
    p.bases.push_back(base);
    p.counts.push_back(k);
  }
  *out = p.ticket;
  pending_.push_back(std::move(p));
  return Code::kSuccess;
}

Status Client::poll(Ticket t, bool* done) {
  std::lock_guard<std::mutex> g(mu_);
  pe_->progress();
  *done = collect(t);
  if (!*done) return Code::kInProgress;
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Pending& p) { return p.ticket == t; });
  if (it == pending_.end()) return Code::kNotFound;
  Status st = it->first;
  pending_.erase(it);
  return st;
}

Status Client::wait(Ticket t) {
  const uint64_t deadline =
      monotonic_ns() + static_cast<uint64_t>(opts_.op_timeout_ms) * 1000000ull;
  for (;;) {
    bool done = false;
    Status st = poll(t, &done);
    if (done) return st;
    if (monotonic_ns() > deadline) return Code::kTimeout;
    // Short sleeps: other threads need the lock too.
    std::lock_guard<std::mutex> g(mu_);
    pe_->wait(20000, 1);
  }
}

Status Client::batch_io(Op op, const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                        const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call) {
  std::lock_guard<std::mutex> g(mu_);
  Status first;
  Status failed;  // the first message the agent did not answer entry by entry
  Status conn = ensure_connected();
  if (!conn.ok()) {
    for (uint32_t i = 0; i < n; ++i)
      if (per_entry) per_entry[i] = conn;
    if (call) *call = conn;
    return conn;
  }
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(IoEntry);
  std::vector<IoEntry> es;
  std::vector<uint8_t> resp;
  for_each_message(
      s, keys, offsets, lengths, n, per_msg, &es, [&](uint32_t base, const IoEntry* e, uint32_t k) {
        resp.clear();
        Status st = this->call(op, 0, e, sizeof(IoEntry), k, &resp);
        const uint8_t* codes =
            resp.size() >= sizeof(AgentHeader) + k ? resp.data() + sizeof(AgentHeader) : nullptr;
        // No entry-by-entry answer: every entry of the message failed with the call.
        const Status whole = st.ok() ? Status(Code::kCorrupted) : st;
        if (codes == nullptr && failed.ok()) failed = whole;
        for (uint32_t i = 0; i < k; ++i) {
          Status x = codes ? Status(static_cast<Code>(codes[i])) : whole;
          if (per_entry) per_entry[base + i] = x;
          if (!x.ok() && first.ok()) first = x;
        }
        return true;
      });
  if (call) *call = failed;
  return first;
}

Status Client::store(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                     const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call) {
  return batch_io(Op::kStore, s, keys, offsets, lengths, n, per_entry, call);
}

Status Client::retrieve(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                        const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call) {
  return batch_io(Op::kRetrieve, s, keys, offsets, lengths, n, per_entry, call);
}

}  // namespace dpukv
