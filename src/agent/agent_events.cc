// The agent's event feed (agent.h, event_feed.h): SUBSCRIBE, the residency
// changes the cache reports, queued per subscriber's view and sent as EVENTS
// messages in batches.
#include "agent/agent.h"

#include <cstring>
#include <string>

#include "agent/agent_session.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

// Every tenant's events, or every tenant's chunks cleared: an admin's (kAllTenants).
void Agent::on_subscribe(Session* s, const AgentHeader& h, const uint8_t*, uint32_t) {
  const bool all = (h.flags & agent::kAllTenants) != 0;
  if (all && !s->admin) {
    ++counters_.not_permitted;
    reply(s, h, Code::kNotPermitted, nullptr, 0);
    return;
  }
  s->feed.all_tenants = all;
  subscribe(s);
  reply(s, h, Code::kSuccess, nullptr, 0);
}

void Agent::subscribe(Session* s) {
  if (s->subscribed) return;
  s->subscribed = true;
  s->feed.model = s->model;
  s->feed.tenant_tag = s->tenant->tag;
  s->feed.owner = s;
  if (feed_.add(&s->feed)) cache_->add_residency_listener(&Agent::on_residency, this, false);
}

void Agent::unsubscribe(Session* s) {
  if (!s->subscribed) return;
  s->subscribed = false;
  if (feed_.remove(&s->feed)) cache_->remove_residency_listener(&Agent::on_residency, this);
}

void Agent::on_residency(void* arg, const ChunkKey& key, bool present) {
  auto* a = static_cast<Agent*>(arg);
  if (!a->feed_.record(key, present)) ++a->counters_.events_dropped;
}

// Sends the queued events to every subscriber, in messages of at most max_msg
// bytes. A subscriber whose send queue is full misses the batch and is told so by
// the next one (kEventsLost); it is not disconnected.
void Agent::flush_events() {
  const uint32_t per_msg =
      (opts_.max_msg - static_cast<uint32_t>(sizeof(AgentHeader))) / sizeof(agent::ChunkEvent);
  // A failed send may close a connection, and its disconnect changes the feed's
  // subscribers: walk a copy, each session held (pending) while it is sent to.
  std::vector<Session*> to;
  to.reserve(feed_.subscribers());
  for (FeedSubscriber* f : feed_.subscriber_list()) to.push_back(static_cast<Session*>(f->owner));
  for (Session* s : to) ++s->pending;
  for (Session* s : to) {
    s->feed.model = s->model;  // as its HELLO said, whenever it subscribed
    size_t cursor = 0;
    while (!s->gone) {
      const uint32_t n = feed_.next_message(s->feed, &cursor, per_msg, &event_msg_);
      if (n == 0) break;
      ComchSendTask* t;
      Status st = s->server->send_alloc_init(
          s->conn, event_msg_.data(), static_cast<uint32_t>(event_msg_.size()), UserData{}, &t);
      if (st.ok()) {
        st = s->server->submit(t);
        if (!st.ok()) (void)s->server->free(t);
      }
      if (s->gone) break;  // the send found the peer dead
      if (!st.ok()) {
        s->feed.lost = true;
        counters_.events_dropped += n;
        break;
      }
      s->feed.lost = false;
      counters_.events_sent += n;
    }
  }
  for (Session* s : to) {
    --s->pending;
    release_session(s);
  }
  feed_.sent();
}

}  // namespace dpukv
