// The host-side client library: a thin proxy to the offload agent. Staging memory
// is exported to the agent once; store and retrieve name regions of it, and the
// agent's DMA moves the bytes: no KV byte crosses the socket.
//
// Never blocks inference for long and never breaks it: while the agent is gone,
// lookup answers 0 (recompute) and other calls fail fast with CONNECTION_RESET;
// the client reconnects (and re-exports its staging memory) when the agent is back,
// trying at most once per reconnect_interval_ms from inside a call.
//
// Thread safety: every method may be called from any thread; calls are serialized
// by one lock (one control channel per client). A small keepalive thread runs the
// channel between calls (heartbeats both ways), so an inference process that does
// not touch the cache for a while is not taken for dead.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comch/client.h"
#include "protocol/agent_wire.h"
#include "protocol/chunk_key.h"
#include "runtime/cuda_driver.h"
#include "runtime/mem_region.h"

namespace dpukv {

struct ClientOptions {
  std::string socket_path;  // find_agent_socket() if empty
  uint32_t connect_timeout_ms = 2000;
  uint32_t op_timeout_ms = 30000;
  uint32_t reconnect_interval_ms = 1000;
  uint32_t heartbeat_ms = 1000;
  uint64_t model = 0;  // announce: this session names keys of this model only (0: any)
  // An agent that is not there at connect is not an error: the client starts
  // disconnected (its calls answer CONNECTION_RESET, staging is kept and exported
  // when the agent appears) and connects on a call once the agent is there.
  bool absent_ok = false;
};

struct Staging {
  uint8_t* data = nullptr;
  size_t size = 0;
  uint64_t id = 0;  // the map id the agent knows it by
};

// GPU memory exported to the agent, which copies into and out of it with its own
// CUDA engine (the offload side owns the copy, as a BlueField's DMA engine writing
// into GPU memory the host exposed). Store and retrieve name regions of it as of
// host staging: staging() is what they take.
struct GpuStaging {
  uint64_t device_ptr = 0;
  size_t size = 0;
  int device = 0;   // CUDA device ordinal in this process
  uint64_t id = 0;  // the map id the agent knows it by (agent::kGpuMapBit set)
  Staging staging() const { return Staging{nullptr, size, id}; }
};

class Client {
 public:
  // Connects (retrying until connect_timeout_ms). NOT_FOUND if no agent answered;
  // FULL if the agent refused for a limit (all its connections, this uid's share,
  // its descriptors) until the timeout; NOT_PERMITTED if it refused this uid.
  static Status connect(const ClientOptions& o, std::unique_ptr<Client>* out);
  // This thread's last connect failure in words a user can act on ("" if none).
  static const char* last_connect_error();
  ~Client();

  // Allocates pre-faulted shared memory and exports it to the agent. TOO_BIG,
  // before any memory is touched, when it would take this client past the agent's
  // per-client staging limit (max_staging_size; see max_staging_bytes()).
  Status alloc_staging(size_t bytes, Staging* out);
  // The agent's limit on all staging of one client (0: none), as of the last HELLO.
  uint64_t max_staging_bytes() const { return max_staging_; }
  // Exports memory the caller already has and keeps using (an engine's paged KV
  // cache) to the agent, in place: the whole pages inside [addr, addr + bytes) move
  // onto shared memory at the same addresses, their bytes kept
  // (MemRegion::share_in_place), so the agent can write loads straight into them
  // (submit_retrieve_rows). *out names those pages (out->data: the first whole
  // page, where offsets count from); the range's partial first and last pages stay
  // private. A child forked later shares these pages rather than copying them.
  // INVALID_VALUE: no whole page inside; TOO_BIG: past the staging limit, as
  // alloc_staging; BAD_STATE: another live client of this process shared some of
  // these pages (sharing them again would move them from under its export).
  // Nothing may write the range while this runs. The pages stay the caller's: its
  // own free unmaps them, and nothing may be loaded into them after that (close
  // the client first).
  Status share_memory(void* addr, size_t bytes, Staging* out);
  // True when the agent said (at the last HELLO) that it takes submit_retrieve_rows.
  bool agent_rows();

  // True when the agent said (at the last HELLO) that it copies GPU memory.
  bool agent_gpu();
  // Exports [device_ptr, device_ptr + bytes) of CUDA device `device` (ordinal)
  // to the agent: the CUDA driver is loaded in this process (DPUKV_CUDA_DRIVER,
  // else libcuda.so.1) for the IPC handle of the allocation that holds the range.
  // NOT_SUPPORTED: no driver here, or the agent has no GPU path (use host staging);
  // NOT_PERMITTED: the agent does not see this GPU; INVALID_VALUE: not device
  // memory, or the range leaves its allocation. *why (may be null) says which.
  // The export is made again when the client reconnects to a restarted agent.
  // The agent opens only memory that proves it is the sender's: the export (and
  // each one again) waits for the context's work to finish, writes the agent's
  // proof into the range's first 16 bytes and puts their bytes back after.
  Status export_gpu(uint64_t device_ptr, size_t bytes, int device, GpuStaging* out,
                    std::string* why = nullptr);
  // Closes an export at the agent (the memory itself stays the caller's).
  // INVALID_VALUE: not an export of this client's (released already).
  Status release_gpu(const GpuStaging& g);

  // The agent's event feed: the chunks (of this session's model) that became
  // present or left every tier, in order, for a router that tracks where prefixes
  // are. take_events() hands over what arrived (never blocks); *lost is true when
  // some were dropped since the last call (a slow reader, a reconnect): the
  // consumer should rebuild its view. Subscriptions survive reconnects.
  // The chunks are this client's tenant's; every_tenant (admins only, else
  // NOT_PERMITTED) asks for every tenant's, each event's tenant field its tag.
  Status subscribe_events(bool every_tenant = false);
  Status take_events(std::vector<agent::ChunkEvent>* out, bool* lost);

  // Batch operations over regions of one staging buffer. per_entry (may be null)
  // gets each entry's status; the return value is the first error, if any. An
  // entry the agent did not answer (no agent, a lost connection, a malformed
  // reply) gets the call's failure, never SUCCESS. call (may be null) tells the
  // two apart: SUCCESS when every entry holds the agent's own answer, else why
  // the call failed (CONNECTION_RESET, TIMEOUT, CORRUPTED, ...).
  Status store(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
               const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call = nullptr);
  Status retrieve(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                  const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call = nullptr);
  // Leading keys present; 0 when the agent is unreachable.
  uint32_t lookup(const ChunkKey* keys, uint32_t n, bool pin);
  // The same, saying why there is no answer: *hits is set only on SUCCESS.
  Status lookup(const ChunkKey* keys, uint32_t n, bool pin, uint32_t* hits);
  // One lookup per layer (keys: layers runs of per_layer keys, one layer after the
  // other), all sent before the first answer is awaited: one round trip for a
  // connector's whole model. hits[l]: layer l's leading keys present.
  Status lookup_layers(const ChunkKey* keys, uint32_t per_layer, uint32_t layers, bool pin,
                       uint32_t* hits);
  Status unpin(const ChunkKey* keys, uint32_t n);
  Status contains(const ChunkKey* keys, uint32_t n, Status* per_entry, Status* call = nullptr);
  Status remove(const ChunkKey* keys, uint32_t n, Status* per_entry, Status* call = nullptr);
  Status prefetch(const ChunkKey* keys, uint32_t n, Status* per_entry, Status* call = nullptr);
  Status stats_json(std::string* out);
  // Prefill to decode: the agent offers these chunks (it must hold them) to the
  // agent whose cluster node id is node, which reads them into its own cache.
  // per_entry[i] is SUCCESS once the destination holds keys[i]. At most
  // agent::kMaxPushKeys keys; NOT_SUPPORTED if the agent is not in a cluster.
  Status push(uint64_t node, const ChunkKey* keys, uint32_t n, Status* per_entry);
  // Drops every chunk of this client's tenant and model (every model if it named
  // none) that is not in use or pinned; every_tenant: of every tenant (admins
  // only, else NOT_PERMITTED).
  Status clear(uint64_t* removed, bool every_tenant = false);

  // Asynchronous forms: submit now, collect later. The ticket finishes when every
  // entry has a status (written to per_entry, which must stay valid until then).
  // poll() never blocks; wait() blocks until the ticket finishes (or the op timeout).
  using Ticket = uint64_t;
  Status submit_store(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                      const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out);
  Status submit_retrieve(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                         const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out);
  // A retrieve whose chunks land in rows of s (a paged cache's blocks, shared in
  // place by share_memory): chunk i fills its rows in order, rows_per_chunk rows
  // per chunk but the last, which has last_rows; row_offsets holds every row's
  // offset into s, (n - 1) * rows_per_chunk + last_rows of them, each row
  // row_bytes long. The chunk's bytes move once, the agent's DMA engine writing the
  // rows (no staging). INVALID_VALUE: counts out of range (rows_per_chunk at most
  // agent::kMaxRowsPerChunk) or a row outside s; NOT_SUPPORTED: the agent does not
  // take it (agent_rows()).
  Status submit_retrieve_rows(const Staging& s, const ChunkKey* keys, uint32_t n,
                              const uint64_t* row_offsets, uint32_t row_bytes,
                              uint32_t rows_per_chunk, uint32_t last_rows, Status* per_entry,
                              Ticket* out);
  Status poll(Ticket t, bool* done);
  Status wait(Ticket t);

  bool connected();
  // A request with arbitrary bytes, for tests of the agent's validation.
  Status raw_request(const void* msg, uint32_t len, std::vector<uint8_t>* response);

 private:
  Client() = default;
  Status ensure_connected();
  Status open_channel(uint32_t timeout_ms);
  Status call(agent::Op op, uint16_t flags, const void* entries, uint32_t entry_size, uint32_t n,
              std::vector<uint8_t>* response);
  Status batch_io(agent::Op op, const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                  const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call);
  Status keys_op(agent::Op op, const ChunkKey* keys, uint32_t n, Status* per_entry, Status* call);
  Status wait_response(uint64_t id, std::vector<uint8_t>* out);
  Status send_request(agent::Op op, uint16_t flags, const void* entries, uint32_t entry_size,
                      uint32_t n, uint64_t* id, uint32_t count = UINT32_MAX);
  Status submit_io(agent::Op op, const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                   const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out);
  bool collect(Ticket t);  // true once finished

  std::mutex mu_;
  ClientOptions opts_;
  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<ComchClient> ch_;
  struct StagingMem {
    std::unique_ptr<MemRegion> mem;
    std::unique_ptr<Mmap> map;
    bool in_place = false;  // share_memory's: the range stays claimed until ~Client
  };
  std::vector<StagingMem> staging_;
  // TOO_BIG (logged) when `bytes` more would take this client past max_staging_.
  Status staging_fits(size_t bytes);
  // Exports a new staging map (now, or when the agent appears) and keeps it.
  Status add_staging(StagingMem s, Staging* out);
  uint64_t next_id_ = 1;
  uint64_t last_attempt_ns_ = 0;
  // Responses arrive on the channel's callback; the waiting call picks its own.
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> responses_;
  bool lost_ = false;
  uint64_t max_staging_ = 0;            // from the agent's HELLO reply
  bool agent_gpu_ = false;              // the same: the agent copies GPU memory
  bool agent_rows_ = false;             // the same: the agent takes RETRIEVE_ROWS
  std::unique_ptr<cuda::Driver> cuda_;  // loaded at the first GPU export
  struct GpuExport {
    agent::GpuExportEntry e;
    uint64_t device_ptr;  // where the range starts: the proof is written there
    int device;
  };
  std::vector<GpuExport> gpu_exports_;  // made again on reconnect
  uint64_t next_gpu_id_ = 1;
  // Asks for a proof, writes it at the range's start (the range's own bytes are
  // put back after), and exports (agent_wire.h, kGpuProof).
  Status send_gpu_export(const GpuExport& x, std::string* why);
  Status write_device(uint64_t device_ptr, int device, const void* src, void* old, size_t n,
                      std::string* why);
  void take_event_message(const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  bool subscribed_ = false;
  uint16_t subscribe_flags_ = 0;
  std::vector<agent::ChunkEvent> events_;  // arrived, not taken
  bool events_lost_ = false;
  static constexpr size_t kMaxEvents = 1 << 20;
  struct Pending {
    Ticket ticket;
    std::vector<uint64_t> ids;     // one request per message
    std::vector<uint32_t> bases;   // first entry of each message
    std::vector<uint32_t> counts;  // entries of each message
    Status* per_entry;
    uint32_t answered = 0;
    Status first;
  };
  std::vector<Pending> pending_;
  Ticket next_ticket_ = 1;
  std::thread keepalive_;
  std::mutex ka_mu_;
  std::condition_variable ka_cv_;
  bool ka_stop_ = false;
  void keepalive_loop();
};

}  // namespace dpukv
