// The agent's event feed (SUBSCRIBE / EVENTS): the cache's residency changes,
// queued as they happen and cut into EVENTS messages per subscriber, each seeing
// only chunks of its model and tenant (an admin's feed: every tenant's, each event
// saying whose). The feed owns the queue and the list of subscribers; sending, and
// what a failed send does to a session, stay the agent's.
//
// Contract: at most kMaxPending events wait; past that the newest are dropped and
// every subscriber's next message says events were lost (agent::kEventsLost), as
// is a subscriber's whose message could not be sent. Keys leave the feed as their
// client named them (tenant_unscope). Threading: the agent's progress thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "protocol/agent_wire.h"
#include "protocol/chunk_key.h"

namespace dpukv {

// What a subscriber may see, and whether its last message went out.
struct FeedSubscriber {
  uint64_t model = 0;        // 0: every model
  uint32_t tenant_tag = 0;   // its tenant's tag (protocol/tenant_key.h)
  bool all_tenants = false;  // an admin's feed of every tenant's events
  bool lost = false;         // a message to it could not be sent: the next one says so
  void* owner = nullptr;     // the caller's (the agent's session)
};

class EventFeed {
 public:
  static constexpr size_t kMaxPending = 1 << 16;

  // True when s is the first subscriber (the caller starts listening to the cache).
  bool add(FeedSubscriber* s);
  // True when s was the last (the caller stops listening; the queue is dropped).
  bool remove(FeedSubscriber* s);
  size_t subscribers() const { return subscribers_.size(); }
  const std::vector<FeedSubscriber*>& subscriber_list() const { return subscribers_; }

  // A chunk became present (stored) or left every tier. False when it was dropped
  // (the queue is full).
  bool record(const ChunkKey& key, bool present);
  size_t pending() const { return events_.size(); }

  // The next EVENTS message for s from event *cursor on: at most per_msg events of
  // those s may see, header included, into *msg. Returns how many it holds (0: none
  // left for s; *cursor then is pending()).
  uint32_t next_message(const FeedSubscriber& s, size_t* cursor, uint32_t per_msg,
                        std::vector<uint8_t>* msg) const;
  // Every subscriber has been offered the queue: it is emptied.
  void sent();

 private:
  std::vector<FeedSubscriber*> subscribers_;
  std::vector<agent::ChunkEvent> events_;  // not sent yet, at most kMaxPending
  bool lost_ = false;                      // some were dropped: the next batch says so
};

}  // namespace dpukv
