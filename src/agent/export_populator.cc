#include "agent/export_populator.h"

namespace dpukv {

void ExportPopulator::add(AgentSession* s, Mmap* m) {
  if (m->populated()) return;  // not dense, or done
  for (const Entry& e : queue_)
    if (e.session == s && e.map_id == m->peer_map_id()) return;
  ++s->pending;
  queue_.push_back({s, m->peer_map_id()});
}

void ExportPopulator::step() {
  if (queue_.empty()) return;
  const Entry e = queue_.front();
  Mmap* m = e.session->gone ? nullptr : e.session->conn->imported_map(e.map_id);
  if (m != nullptr) {
    const size_t before = m->populated_bytes();
    const bool done = m->populate_some(2u << 20);
    *populated_bytes_ += m->populated_bytes() - before;
    if (!done) return;
  }
  queue_.pop_front();
  --e.session->pending;
  owner_->release_session(e.session);
}

void ExportPopulator::drop_all() {
  while (!queue_.empty()) {
    const Entry e = queue_.front();
    queue_.pop_front();
    --e.session->pending;
    owner_->release_session(e.session);
  }
}

}  // namespace dpukv
