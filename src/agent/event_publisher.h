// The agent's side of the event feed (SUBSCRIBE / EVENTS): a subscribed session
// gets the residency changes the cache reports, as its model and tenant see them
// (event_feed.h keeps the views), in EVENTS messages sent in batches: every 5 ms,
// or sooner when a message's worth is queued. A subscriber whose send queue is
// full misses a batch and is told so by the next (kEventsLost); it is not
// disconnected. It listens to the cache only while someone subscribes.
//
// It owns the feed and the message it reuses; it reaches the agent only to hand
// back the sessions it held while sending (SessionOwner). Agent's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "agent/agent_session.h"
#include "agent/agent_stats.h"
#include "agent/event_feed.h"
#include "cache/cache_engine.h"

namespace dpukv {

class EventPublisher {
 public:
  // counters: events_sent, events_dropped. max_msg: the comch message bound.
  EventPublisher(SessionOwner* owner, CacheEngine* cache, AgentCounters* counters,
                 uint32_t max_msg);
  ~EventPublisher();
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // s gets the feed from now on, its view set by its model and tenant (and
  // s->feed.all_tenants, set by the caller for an admin). Twice is once.
  void subscribe(AgentSession* s);
  void unsubscribe(AgentSession* s);
  // Sends what is queued if it is time (now_ns: the loop's clock).
  void tick(uint64_t now_ns);
  size_t subscribers() const { return feed_.subscribers(); }

 private:
  static void on_residency(void* arg, const ChunkKey& key, bool present);
  void flush();

  SessionOwner* owner_;
  CacheEngine* cache_;
  AgentCounters* counters_;
  uint32_t max_msg_;
  EventFeed feed_;
  std::vector<uint8_t> msg_;  // an EVENTS message being sent, reused
  uint64_t last_flush_ns_ = 0;
};

}  // namespace dpukv
