// The agent's request protocol, carried in comch DATA messages (comch/wire.h
// frames and checks them first). Little-endian, fixed-size entries; one constants
// header; documented in docs/protocols.md.
//
// A request: AgentHeader, then `count` entries of the op's entry type. A response:
// AgentHeader with op | kResponse, status, and for batch ops `count` status bytes
// (one Code per entry), for LOOKUP one u32 (leading hits), for STATS JSON text.
#pragma once

#include <cstdint>

#include "protocol/chunk_key.h"

namespace dpukv::agent {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr uint16_t kResponse = 0x8000;

enum class Op : uint16_t {
  kHello = 1,          // entry: HelloEntry; response: HelloReply (older agents: status only)
  kStore = 2,          // entries: IoEntry (source regions of the client's staging)
  kRetrieve = 3,       // entries: IoEntry (destination regions)
  kLookup = 4,         // entries: ChunkKey; flags & kPin pins the leading hits
  kContains = 5,       // entries: ChunkKey; response: a status byte per key (SUCCESS or NOT_FOUND)
  kRemove = 6,         // entries: ChunkKey
  kPrefetch = 7,       // entries: ChunkKey
  kUnpin = 8,          // entries: ChunkKey
  kStats = 9,          // no entries; response: JSON
  kClear = 10,         // no entries: drops every chunk of the session's tenant and model
                       // (all: model 0) that is not in use or pinned; flags & kAllTenants:
                       // of every tenant (admins only); response: u64 chunks removed
  kPush = 11,          // body: PushHeader, then count ChunkKeys (at most kMaxPushKeys): the
                       // agent offers those chunks to another agent of its cluster (a
                       // prefill-to-decode transfer); response: a status byte per key,
                       // SUCCESS once the destination holds it
  kGpuExport = 12,     // entry: GpuExportEntry; the client's GPU memory, by CUDA IPC
                       // handle, its first kGpuProofBytes holding the session's proof
                       // (kGpuProof). Response: status, and on failure the reason as text.
                       // NOT_SUPPORTED: the agent has no GPU path (HelloReply says so).
  kGpuRelease = 13,    // entry: u64 map id of a GPU export; the agent closes it
  kSubscribe = 14,     // no entries: from now on the agent sends this session EVENTS
  kEvents = 15,        // agent -> client, unsolicited (op | kResponse, request_id 0):
                       // count ChunkEvents, chunks of the session's tenant and model
                       // (all: model 0) that became present or left every tier, in order
                       // (an admin's SUBSCRIBE with kAllTenants: of every tenant);
                       // flags & kEventsLost: some were dropped before these
  kGpuProof = 16,      // no entries; response: kGpuProofBytes random bytes, the session's
                       // proof for its next kGpuExport (one use; a new one replaces it)
  kRetrieveRows = 17,  // body: RowsHeader, count ChunkKeys, then the rows' u64 offsets
                       // into the map (rows_per_chunk per chunk, last_rows for the last):
                       // each chunk lands in its rows in order, a paged cache's blocks
                       // written in place (one copy). Response: a status byte per key, as
                       // RETRIEVE. HelloReply's kHelloRows says the agent takes it.
};

// A CUDA IPC handle names an allocation, not who may use it: any process that
// learns or guesses one can open it. So a GPU export must prove the sender holds the
// memory: it asks for a proof (kGpuProof), writes it at the start of the range it
// exports, and exports; the agent opens the handle, reads those bytes and refuses
// the export (NOT_PERMITTED) unless they are the session's proof.
inline constexpr uint32_t kGpuProofBytes = 16;

inline constexpr uint16_t kEventsLost = 1;

struct ChunkEvent {
  ChunkKey key;
  uint8_t present;  // 1: stored (present in a tier); 0: removed from every tier
  uint8_t reserved[3];
  uint32_t tenant;  // an admin's feed of every tenant (kAllTenants): the chunk's tenant tag; else 0
};
static_assert(sizeof(ChunkEvent) == 40);

// Map ids of GPU exports have this bit; memfd exports never do. Store and
// retrieve name either kind in IoEntry::map_id.
inline constexpr uint64_t kGpuMapBit = 1ull << 63;

struct GpuExportEntry {
  uint64_t map_id;          // chosen by the client, with kGpuMapBit
  uint64_t offset;          // of the exported range inside the allocation the handle names
  uint64_t bytes;           // of the range
  uint8_t device_uuid[16];  // the GPU's UUID (cuDeviceGetUuid)
  uint8_t handle[64];       // CUipcMemHandle of the allocation
  uint64_t reserved;        // 0
};
static_assert(sizeof(GpuExportEntry) == 112);

inline constexpr uint32_t kMaxPushKeys = 64;

struct PushHeader {
  uint64_t node;  // the destination agent's cluster node id (`dpukv stat`)
  uint64_t reserved;
};
static_assert(sizeof(PushHeader) == 16);

inline constexpr uint16_t kPin = 1;
// SUBSCRIBE and CLEAR: every tenant's events or chunks, not the session's own
// tenant's. Admins only (root, the agent's user, tenant_admin_group); others get
// NOT_PERMITTED.
inline constexpr uint16_t kAllTenants = 2;

struct AgentHeader {
  uint16_t op;
  uint16_t version;
  uint16_t flags;
  uint8_t status;  // responses: a Code
  uint8_t reserved;
  uint32_t count;
  uint32_t reserved2;
  uint64_t request_id;
};
static_assert(sizeof(AgentHeader) == 24);

struct HelloEntry {
  uint64_t model;  // the only model this session may name in keys (0: any)
  uint64_t reserved;
};
static_assert(sizeof(HelloEntry) == 16);

struct HelloReply {
  uint64_t max_staging_bytes;  // memory this client may export in all (0: no limit)
  uint64_t flags;              // kHelloGpu: the agent copies to and from GPU memory
};
inline constexpr uint64_t kHelloGpu = 1;
inline constexpr uint64_t kHelloRows = 2;  // RETRIEVE_ROWS is served
static_assert(sizeof(HelloReply) == 16);

// A chunk's rows are one scatter list for the DMA engine (its max_list_len, as
// doca_dma_cap_task_memcpy_get_max_buf_list_len bounds a DOCA DMA task's).
inline constexpr uint32_t kMaxRowsPerChunk = 64;

struct RowsHeader {
  uint64_t map_id;          // a map the client exported on this connection (host memory)
  uint32_t row_bytes;       // every row's length
  uint16_t rows_per_chunk;  // rows of each chunk but the last, in [1, kMaxRowsPerChunk]
  uint16_t last_rows;       // rows of the last chunk (a prompt's partial one may have fewer)
  uint64_t reserved;        // 0
};
static_assert(sizeof(RowsHeader) == 24);

// A RETRIEVE_ROWS body of `count` chunks is well formed: its header's fields in
// range, and exactly the keys and row offsets they announce (nothing before or
// after). *rows: the offsets it carries. Offsets are checked against the map later.
inline bool rows_body_valid(uint32_t count, const uint8_t* body, uint64_t len, RowsHeader* out,
                            uint64_t* rows) {
  if (count == 0 || len < sizeof(RowsHeader)) return false;
  RowsHeader h;
  __builtin_memcpy(&h, body, sizeof(h));
  if (h.row_bytes == 0 || h.rows_per_chunk == 0 || h.rows_per_chunk > kMaxRowsPerChunk ||
      h.last_rows == 0 || h.last_rows > h.rows_per_chunk || h.reserved != 0)
    return false;
  const uint64_t n = static_cast<uint64_t>(count - 1) * h.rows_per_chunk + h.last_rows;
  if (len != sizeof(RowsHeader) + static_cast<uint64_t>(count) * sizeof(ChunkKey) + n * 8)
    return false;
  *out = h;
  *rows = n;
  return true;
}

struct IoEntry {
  ChunkKey key;
  uint64_t map_id;  // the client's id of a map it exported on this connection
  uint64_t offset;  // into that map
  uint64_t length;  // store: bytes to store; retrieve: room at offset
};
static_assert(sizeof(IoEntry) == 56);

}  // namespace dpukv::agent
