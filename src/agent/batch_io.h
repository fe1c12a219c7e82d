// The agent's batch I/O: STORE, RETRIEVE and RETRIEVE_ROWS batches. A batch's
// entries are copied out of the message, checked against the session's own
// exported memory (or GPU exports), and submitted to the cache engine as its
// requests and buffers allow: a batch that finds none waits, oldest first, and
// goes on as requests complete (backpressure, as a DOCA task pool gives it, not
// failure). Entries complete independently; the reply, one status byte per
// entry, goes when the last is done.
//
// It owns its batches (made once: no allocation per request) and the queue of
// those that wait. It reaches the agent only through Host: the reply, and the
// session let go after its last batch. Runs on the agent's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "agent/agent_session.h"
#include "agent/agent_stats.h"
#include "agent/gpu_service.h"
#include "cache/cache_engine.h"
#include "protocol/agent_wire.h"
#include "runtime/buf.h"

namespace dpukv {

class BatchIo {
 public:
  // The agent: the reply, and (SessionOwner) a session handed back after its batch.
  class Host : public SessionOwner {
   public:
    // Answers the request h (worst: the header's status; body: a byte per entry).
    virtual void reply(AgentSession* s, const agent::AgentHeader& h, Status worst, const void* body,
                       uint32_t len) = 0;

   protected:
    ~Host() = default;
  };
  // What it submits to and counts in; the agent owns them all.
  struct Parts {
    CacheEngine* cache = nullptr;
    GpuService* gpu = nullptr;
    BufInventory* inv = nullptr;
    AgentCounters* counters = nullptr;  // not_permitted, stalled_batches
    AgentLatencies* latencies = nullptr;
    uint64_t max_chunk_bytes = 0;  // a stored entry's bound
  };
  // max_entries: the most entries a message can carry.
  BatchIo(Host* host, const Parts& p, uint32_t max_batches, uint32_t max_entries);
  ~BatchIo();
  BatchIo(const BatchIo&) = delete;
  BatchIo& operator=(const BatchIo&) = delete;

  // A STORE or RETRIEVE batch of h.count entries (body checked whole). AGAIN: every
  // batch is in flight; the caller answers so. Otherwise the batch answers itself.
  Status start(AgentSession* s, const agent::AgentHeader& h, const uint8_t* body);
  // A RETRIEVE_ROWS batch: each chunk's rows of a map the session exported (a paged
  // KV cache's blocks) are one scatter list, so its bytes move once. The body was
  // checked whole (agent::rows_body_valid); offsets are checked as chunks go.
  Status start_rows(AgentSession* s, const agent::AgentHeader& h, const uint8_t* body,
                    uint32_t len);
  // A spare batch's status bytes, at least n of them, to answer a request of n keys
  // without allocating; null if none is spare or they are too few.
  uint8_t* spare_status(uint32_t n);

 private:
  struct Batch;
  struct Slot {
    Batch* batch;
    uint32_t index;
  };
  Batch* take(AgentSession* s, const agent::AgentHeader& h);
  static void op_done(void* arg, Status st);
  void resume_stalled();
  void submit_entries(Batch* b, bool fresh);
  Status submit_entry(AgentSession* s, agent::Op op, const agent::IoEntry& e, void* slot);
  Status submit_rows_entry(AgentSession* s, const Batch& b, const agent::IoEntry& e, void* slot);
  bool can_submit() const;
  void finish(Batch* b);

  Host* host_;
  Parts parts_;
  std::vector<std::unique_ptr<Batch>> batches_;
  std::vector<Batch*> free_;
  std::deque<Batch*> stalled_;  // waiting for cache requests, oldest first
  bool resuming_ = false;
};

}  // namespace dpukv
