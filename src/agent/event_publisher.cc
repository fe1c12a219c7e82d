#include "agent/event_publisher.h"

namespace dpukv {

EventPublisher::EventPublisher(SessionOwner* owner, CacheEngine* cache, AgentCounters* counters,
                               uint32_t max_msg)
    : owner_(owner), cache_(cache), counters_(counters), max_msg_(max_msg) {}

EventPublisher::~EventPublisher() {
  if (feed_.subscribers() != 0) cache_->remove_residency_listener(&on_residency, this);
}

void EventPublisher::subscribe(AgentSession* s) {
  if (s->subscribed) return;
  s->subscribed = true;
  s->feed.model = s->model;
  s->feed.tenant_tag = s->tenant->tag;
  s->feed.owner = s;
  if (feed_.add(&s->feed)) cache_->add_residency_listener(&on_residency, this, false);
}

void EventPublisher::unsubscribe(AgentSession* s) {
  if (!s->subscribed) return;
  s->subscribed = false;
  if (feed_.remove(&s->feed)) cache_->remove_residency_listener(&on_residency, this);
}

void EventPublisher::on_residency(void* arg, const ChunkKey& key, bool present) {
  auto* p = static_cast<EventPublisher*>(arg);
  if (!p->feed_.record(key, present)) ++p->counters_->events_dropped;
}

// Events go out in batches: every 5 ms at most, or when a message's worth waits.
void EventPublisher::tick(uint64_t now_ns) {
  if (feed_.pending() == 0) return;
  if (now_ns - last_flush_ns_ < 5000000ull && feed_.pending() < max_msg_ / 40) return;
  last_flush_ns_ = now_ns;
  flush();
}

// Sends the queued events to every subscriber, in messages of at most max_msg
// bytes. A subscriber whose send queue is full misses the batch and is told so by
// the next one (kEventsLost); it is not disconnected.
void EventPublisher::flush() {
  const uint32_t per_msg =
      (max_msg_ - static_cast<uint32_t>(sizeof(agent::AgentHeader))) / sizeof(agent::ChunkEvent);
  // A failed send may close a connection, and its disconnect changes the feed's
  // subscribers: walk a copy, each session held (pending) while it is sent to.
  std::vector<AgentSession*> to;
  to.reserve(feed_.subscribers());
  for (FeedSubscriber* f : feed_.subscriber_list())
    to.push_back(static_cast<AgentSession*>(f->owner));
  for (AgentSession* s : to) ++s->pending;
  for (AgentSession* s : to) {
    s->feed.model = s->model;  // as its HELLO said, whenever it subscribed
    size_t cursor = 0;
    while (!s->gone) {
      const uint32_t n = feed_.next_message(s->feed, &cursor, per_msg, &msg_);
      if (n == 0) break;
      ComchSendTask* t;
      Status st = s->server->send_alloc_init(s->conn, msg_.data(),
                                             static_cast<uint32_t>(msg_.size()), UserData{}, &t);
      if (st.ok()) {
        st = s->server->submit(t);
        if (!st.ok()) (void)s->server->free(t);
      }
      if (s->gone) break;  // the send found the peer dead
      if (!st.ok()) {
        s->feed.lost = true;
        counters_->events_dropped += n;
        break;
      }
      s->feed.lost = false;
      counters_->events_sent += n;
    }
  }
  for (AgentSession* s : to) {
    --s->pending;
    owner_->release_session(s);
  }
  feed_.sent();
}

}  // namespace dpukv
