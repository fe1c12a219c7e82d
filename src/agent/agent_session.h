// A client's connection as the agent sees it (agent.h): who it is (tenant,
// model, admin), what it holds (pins, GPU exports, the event feed) and how many
// of its batches are in flight. It stays until its last batch completes after it
// is gone (agent_sessions.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "agent/event_feed.h"
#include "agent/gpu_service.h"
#include "agent/tenants.h"
#include "comch/server.h"
#include "protocol/agent_wire.h"
#include "protocol/chunk_key.h"

namespace dpukv {

struct AgentSession {
  ComchConnection* conn = nullptr;
  ComchServer* server = nullptr;   // the socket it came through
  const Tenant* tenant = nullptr;  // its keys are folded with tenant->tag
  bool admin = false;              // may clear and watch every tenant
  uint64_t model = 0;              // 0: any
  bool gone = false;
  uint32_t pending = 0;  // batches in flight
  std::vector<ChunkKey> pinned;
  GpuService::Exports gpu;  // GPU memory it exported
  // The proof its next GPU export must hold (kGpuProof), while has_proof.
  uint8_t proof[agent::kGpuProofBytes] = {};
  bool has_proof = false;
  bool subscribed = false;  // sent the event feed
  FeedSubscriber feed;      // what of the feed it sees (its model and tenant)
};

// Who owns the sessions (the agent): the parts that hold a session while they
// work for it (pending) hand it back here, which frees it once it is gone and
// nothing holds it.
class SessionOwner {
 public:
  virtual void release_session(AgentSession* s) = 0;

 protected:
  ~SessionOwner() = default;
};

// The key the cache keeps for a key the session names: NOT_PERMITTED for a key of
// another model, INVALID_VALUE for one that cannot be folded (agent_sessions.cc).
Status scope_key(const AgentSession* s, const ChunkKey& k, ChunkKey* kept);

}  // namespace dpukv
