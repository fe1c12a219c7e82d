// A client's export (staging, or an engine's KV cache shared in place) is faulted
// in ahead of the copies into it, 2 MiB per loop turn (about 0.25 ms here)
// between requests: the first touch of a page costs ~1.3 us, four times its copy.
// Only a dense export, whose pages all exist (Mmap::dense), so nothing is
// allocated for it. Each session is held (pending) while one of its maps waits.
// Agent's thread.
#pragma once

#include <cstdint>
#include <deque>

#include "agent/agent_session.h"
#include "runtime/mmap.h"

namespace dpukv {

class ExportPopulator {
 public:
  // populated_bytes: the agent's counter of bytes faulted in.
  ExportPopulator(SessionOwner* owner, uint64_t* populated_bytes)
      : owner_(owner), populated_bytes_(populated_bytes) {}

  // m, just imported for s, is faulted in from the next step on (once).
  void add(AgentSession* s, Mmap* m);
  // Faults in the front map's next 2 MiB; a map that is done, or whose session is
  // gone, leaves and its session is handed back.
  void step();
  // Every session handed back, nothing faulted in (the agent is stopping).
  void drop_all();
  bool idle() const { return queue_.empty(); }
  size_t waiting() const { return queue_.size(); }

 private:
  struct Entry {
    AgentSession* session;
    uint64_t map_id;  // the session's id of the map
  };
  SessionOwner* owner_;
  uint64_t* populated_bytes_;
  std::deque<Entry> queue_;  // one step per loop turn, front first
};

}  // namespace dpukv
