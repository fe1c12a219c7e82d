#include "agent/event_feed.h"

#include <cstring>

#include "protocol/tenant_key.h"

namespace dpukv {

bool EventFeed::add(FeedSubscriber* s) {
  for (const FeedSubscriber* have : subscribers_)
    if (have == s) return false;
  subscribers_.push_back(s);
  return subscribers_.size() == 1;
}

bool EventFeed::remove(FeedSubscriber* s) {
  for (size_t i = 0; i < subscribers_.size(); ++i) {
    if (subscribers_[i] != s) continue;
    subscribers_[i] = subscribers_.back();
    subscribers_.pop_back();
    if (!subscribers_.empty()) return false;
    events_.clear();
    lost_ = false;
    return true;
  }
  return false;
}

bool EventFeed::record(const ChunkKey& key, bool present) {
  if (events_.size() >= kMaxPending) {  // nobody drains them: keep the newest lost
    lost_ = true;
    return false;
  }
  agent::ChunkEvent e{};
  e.key = key;
  e.present = present ? 1 : 0;
  events_.push_back(e);
  return true;
}

uint32_t EventFeed::next_message(const FeedSubscriber& s, size_t* cursor, uint32_t per_msg,
                                 std::vector<uint8_t>* msg) const {
  msg->assign(sizeof(agent::AgentHeader), 0);
  uint32_t n = 0;
  size_t i = *cursor;
  for (; i < events_.size() && n < per_msg; ++i) {
    const agent::ChunkEvent& kept = events_[i];
    if (s.model != 0 && kept.key.model != s.model) continue;
    const uint32_t tag = key_tenant(kept.key);
    if (!s.all_tenants && tag != s.tenant_tag) continue;
    // The key as its client named it; an admin's feed says whose it is.
    agent::ChunkEvent e = kept;
    e.key = tenant_unscope(kept.key);
    if (s.all_tenants) e.tenant = tag;
    const auto* p = reinterpret_cast<const uint8_t*>(&e);
    msg->insert(msg->end(), p, p + sizeof(e));
    ++n;
  }
  *cursor = i;
  if (n == 0) return 0;
  agent::AgentHeader h{};
  h.op = static_cast<uint16_t>(static_cast<uint16_t>(agent::Op::kEvents) | agent::kResponse);
  h.version = agent::kProtocolVersion;
  h.flags = (lost_ || s.lost) ? agent::kEventsLost : 0;
  h.count = n;
  std::memcpy(msg->data(), &h, sizeof(h));
  return n;
}

void EventFeed::sent() {
  events_.clear();
  lost_ = false;
}

}  // namespace dpukv
