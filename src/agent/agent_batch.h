// A batch request in flight (agent_batch_io.cc): its entries, copied out of the
// message, go to the cache engine as requests free up and complete independently;
// the reply goes when the last one is done.
#pragma once

#include <cstdint>
#include <vector>

#include "agent/agent.h"
#include "agent/agent_session.h"

namespace dpukv {

// One batch request in flight: its entries complete independently.
struct Agent::Batch {
  Agent* agent = nullptr;
  Session* session = nullptr;
  agent::AgentHeader hdr{};
  uint32_t remaining = 0;
  uint64_t start_ns = 0;
  std::vector<uint8_t> status;  // one Code per entry
  // The request's entries, copied once out of the message (which is gone by the
  // time a batch that waited for cache requests goes on). [next, count) are not yet
  // submitted.
  std::vector<agent::IoEntry> entries;
  uint32_t next = 0;
  // RETRIEVE_ROWS: the rows' offsets into the map rows_hdr names; entry i's rows
  // are row_offsets[entries[i].offset, + entries[i].length). Grows once to the
  // largest such message a batch has carried, then is reused.
  bool rows = false;
  agent::RowsHeader rows_hdr{};
  std::vector<uint64_t> row_offsets;
  struct Slot {
    Batch* batch;
    uint32_t index;
  };
  std::vector<Slot> slots;
};

}  // namespace dpukv
