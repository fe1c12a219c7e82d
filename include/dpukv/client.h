/* dpukv client: C ABI for other languages. Every function returns a status code
 * (0 = success; the codes and their names are those of dpukv_status_name()). A
 * handle is used by one thread at a time or serialized by the library. */
#ifndef DPUKV_CLIENT_H
#define DPUKV_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dpukv_client dpukv_client;

/* A chunk key: 32 bytes, as dpukv::ChunkKey. */
typedef struct dpukv_key {
  uint64_t model;
  uint32_t world_size;
  uint32_t rank;
  uint64_t layout;
  uint64_t prefix_hash;
} dpukv_key;

/* socket may be NULL (the default path). model: 0, or the model id this session uses. */
int dpukv_connect(const char* socket, uint64_t model, dpukv_client** out);
/* As dpukv_connect, but an agent that is not there yet is not an error: the client
 * starts disconnected (calls answer CONNECTION_RESET; staging is kept and exported
 * once the agent is there) and connects on a later call when the agent appears. */
int dpukv_connect_absent_ok(const char* socket, uint64_t model, dpukv_client** out);
/* 1 while the client has a live session with its agent, else 0. */
int dpukv_connected(dpukv_client* c);
void dpukv_close(dpukv_client* c);
const char* dpukv_status_name(int status);
/* Why this thread's last dpukv_connect failed, in words a user can act on (the
 * agent full, this user over its share of connections, permission, no agent). */
const char* dpukv_last_connect_error(void);

/* Shared staging memory exported to the agent; *data stays valid until close. */
int dpukv_alloc_staging(dpukv_client* c, size_t bytes, void** data, uint64_t* staging_id);

/* Memory the caller has and keeps using (an engine's paged KV cache), exported in
 * place: the whole pages inside [addr, addr + bytes) move onto shared memory at the
 * same addresses, their bytes kept. *data, *size: those pages (row offsets count
 * from *data); the partial first and last pages stay private. Nothing may write the
 * range during the call; the caller's own free unmaps it (close the client first).
 * INVALID_VALUE: no whole page inside; TOO_BIG: past the agent's staging limit;
 * BAD_STATE: another open client of this process shared some of these pages. */
int dpukv_share_memory(dpukv_client* c, void* addr, size_t bytes, void** data, uint64_t* size,
                       uint64_t* staging_id);
/* 1 when the agent takes dpukv_submit_retrieve_rows (said at connect), else 0. */
int dpukv_agent_rows(dpukv_client* c);

/* GPU memory [device_ptr, device_ptr + bytes) of CUDA device `device` exported to
 * the agent, which copies into and out of it itself (CUDA IPC): store and retrieve
 * take the staging_id as for host staging. NOT_SUPPORTED: no CUDA driver in this
 * process or no GPU path in the agent (use host staging); NOT_PERMITTED: the agent
 * does not see this GPU; INVALID_VALUE: not device memory, or past its allocation. */
int dpukv_export_gpu(dpukv_client* c, uint64_t device_ptr, size_t bytes, int device,
                     uint64_t* staging_id);
/* 1 when the agent copies GPU memory (said at connect), else 0. */
int dpukv_agent_gpu(dpukv_client* c);
/* Closes a GPU export at the agent; the memory stays the caller's. INVALID_VALUE:
 * not an export of this client's (released already). */
int dpukv_release_gpu(dpukv_client* c, uint64_t staging_id);

int dpukv_store(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry);
int dpukv_retrieve(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                   const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry);
/* Number of leading keys present (0 if the agent is unreachable). */
uint32_t dpukv_lookup(dpukv_client* c, const dpukv_key* keys, uint32_t n, int pin);
/* The same, saying why there is no answer: *hits is set only on success. */
int dpukv_lookup_status(dpukv_client* c, const dpukv_key* keys, uint32_t n, int pin,
                        uint32_t* hits);
/* A lookup per layer (keys: `layers` runs of per_layer keys), in one round trip. */
int dpukv_lookup_layers(dpukv_client* c, const dpukv_key* keys, uint32_t per_layer, uint32_t layers,
                        int pin, uint32_t* hits);
int dpukv_unpin(dpukv_client* c, const dpukv_key* keys, uint32_t n);
/* Per-key calls: the return is the call's own status (the agent answered, or
 * why not); each key's outcome is in per_entry (n ints; may be NULL). */
/* Drops chunks: per key SUCCESS, NOT_FOUND, or BAD_STATE for one in use or pinned. */
int dpukv_remove(dpukv_client* c, const dpukv_key* keys, uint32_t n, int* per_entry);
/* Per key SUCCESS if the agent holds it, NOT_FOUND if not (per_entry: n ints). */
int dpukv_contains(dpukv_client* c, const dpukv_key* keys, uint32_t n, int* per_entry);
/* Brings disk-only chunks into memory ahead of a retrieve (per_entry: n ints). */
int dpukv_prefetch(dpukv_client* c, const dpukv_key* keys, uint32_t n, int* per_entry);
/* The most staging bytes this client may map (the agent's per-client limit). */
uint64_t dpukv_max_staging_bytes(dpukv_client* c);
/* Drops every chunk of this client's model not in use or pinned. */
int dpukv_clear(dpukv_client* c, uint64_t* removed);
/* The agent's counters as JSON, NUL-terminated in buf (TOO_BIG if cap is short;
 * *len, if not NULL, gets the length either way). */
int dpukv_stats_json(dpukv_client* c, char* buf, size_t cap, size_t* len);

/* The agent's event feed: chunks of this session's tenant and model stored, or
 * removed from every tier. After subscribing, dpukv_take_events hands over at most max events
 * that arrived (never blocks): *n written, *lost 1 when some were dropped since
 * the last call (rebuild your view). Events not taken stay for the next call. */
typedef struct dpukv_event {
  dpukv_key key;
  uint8_t stored; /* 1 stored, 0 removed */
  uint8_t reserved[3];
  uint32_t tenant; /* the chunk's tenant tag in an admin's feed of every tenant; else 0 */
} dpukv_event;
int dpukv_subscribe_events(dpukv_client* c);
int dpukv_take_events(dpukv_client* c, dpukv_event* out, uint32_t max, uint32_t* n, int* lost);

/* Asynchronous store and retrieve: per_entry (n ints) is written by dpukv_wait,
 * and must stay valid until then. Every ticket is waited for once. */
int dpukv_submit_store(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                       const uint64_t* offsets, const uint64_t* lengths, uint32_t n, int* per_entry,
                       uint64_t* ticket);
int dpukv_submit_retrieve(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                          const uint64_t* offsets, const uint64_t* lengths, uint32_t n,
                          int* per_entry, uint64_t* ticket);
/* A retrieve into rows of a shared map (dpukv_share_memory): chunk i fills its
 * rows in order, rows_per_chunk per chunk (at most 64) but the last, which has
 * last_rows; row_offsets: (n - 1) * rows_per_chunk + last_rows offsets into the
 * map, each row row_bytes long. Collected with dpukv_wait or dpukv_poll.
 * NOT_SUPPORTED: the agent does not take it (dpukv_agent_rows). */
int dpukv_submit_retrieve_rows(dpukv_client* c, uint64_t staging_id, const dpukv_key* keys,
                               uint32_t n, const uint64_t* row_offsets, uint32_t row_bytes,
                               uint32_t rows_per_chunk, uint32_t last_rows, int* per_entry,
                               uint64_t* ticket);
int dpukv_wait(dpukv_client* c, uint64_t ticket);
/* Never blocks: *done is 0 while the call runs (IN_PROGRESS returned); once it
 * finished, *done is 1, per_entry is written, the call's status is returned and
 * the ticket is spent (not waited for again). */
int dpukv_poll(dpukv_client* c, uint64_t ticket, int* done);

/* Prefill to decode: the agent offers these chunks (it must hold them) to the agent
 * of its cluster whose node id is node (`dpukv stat`: "cluster node"), which reads
 * them into its own cache. per_entry[i] (may be NULL) is 0 once the destination
 * holds keys[i]. At most 64 keys; NOT_SUPPORTED if the agent is in no cluster. */
int dpukv_push(dpukv_client* c, uint64_t node, const dpukv_key* keys, uint32_t n, int* per_entry);

/* Keys from prefix-chained block ids (vLLM block hashes, trace ids), one per id,
 * into out (n keys). Returns n. */
uint32_t dpukv_keys_from_block_ids(uint64_t model, const uint64_t* ids, uint32_t n, dpukv_key* out);

/* Keys of a token sequence, chunked as the cache does (see chunk_key.h). Returns
 * how many keys were written (at most max_keys). */
uint32_t dpukv_chunk_keys(uint64_t model, uint32_t world_size, uint32_t rank, uint64_t layout,
                          const int32_t* tokens, size_t n_tokens, uint32_t chunk_tokens,
                          int include_partial, dpukv_key* out, uint32_t max_keys);
/* dpukv_chunk_keys for several layouts at once (one per layer: the prefix hashes
 * are computed once): out holds n_layouts rows of max_keys keys, row l the keys
 * under layouts[l]. Returns the keys in each row (at most max_keys). */
uint32_t dpukv_chunk_keys_layers(uint64_t model, uint32_t world_size, uint32_t rank,
                                 const uint64_t* layouts, uint32_t n_layouts, const int32_t* tokens,
                                 size_t n_tokens, uint32_t chunk_tokens, int include_partial,
                                 dpukv_key* out, uint32_t max_keys);
uint64_t dpukv_model_id(const char* model_name);
/* E.g. dpukv_kv_layout_fingerprint("bfloat16", 32, 8, 128). */
uint64_t dpukv_kv_layout_fingerprint(const char* dtype, uint32_t layers, uint32_t kv_heads,
                                     uint32_t head_dim);

/* KV codecs for a connector that encodes its chunks before storing them (the
 * same codecs as the agent's compress engine): DPUKV_KV_LOSSLESS (byte planes,
 * Huffman: exact), DPUKV_KV_INT8 and DPUKV_KV_INT4 (per channel, groups of tokens:
 * scale and zero point). A chunk is `slabs` independent [tokens, channels]
 * matrices of 16-bit values (DPUKV_KV_BF16 or DPUKV_KV_FP16). An encoded chunk
 * carries its header and checksum, so any reader can check and decode it.
 * flags: 0, or for INT8 and INT4 DPUKV_KV_VALUES_PER_TOKEN: the slabs alternate
 * keys and values (K, V, K, V, ...; an even count), and value slabs are quantized
 * per token (a scale and zero point per token, as KIVI does) instead of per channel. */
enum { DPUKV_KV_LOSSLESS = 2, DPUKV_KV_INT8 = 3, DPUKV_KV_INT4 = 4 };
enum { DPUKV_KV_BF16 = 1, DPUKV_KV_FP16 = 2 };
enum { DPUKV_KV_VALUES_PER_TOKEN = 1 };
/* The largest encoding of len bytes (0 for an unknown codec or flags). */
size_t dpukv_kv_encode_bound(int codec, uint32_t slabs, uint32_t tokens, uint32_t channels,
                             uint32_t flags, size_t len);
/* INVALID_VALUE if the shape is not len bytes, or NaN or infinity in a lossy
 * codec's input, or flags the codec does not take; TOO_BIG if cap is short. */
int dpukv_kv_encode(int codec, int dtype, uint32_t slabs, uint32_t tokens, uint32_t channels,
                    uint32_t flags, const void* src, size_t len, void* dst, size_t cap,
                    size_t* out_len);
/* Decodes n encoded chunks into rows. Chunk i lies at base + offsets[i], in a slot
 * of caps[i] bytes (its length is in its header); it fills rows_per_chunk rows
 * (the last chunk: last_rows), row_bytes each, taken in order from rows (the rows'
 * addresses). per_entry[i]: SUCCESS, or CORRUPTED, its rows untouched, when its
 * header or checksum is wrong or it is not a chunk of that many rows. Returns
 * SUCCESS when every chunk decoded, else the first failure. */
int dpukv_kv_decode_rows(const void* base, const uint64_t* offsets, const uint64_t* caps,
                         uint32_t n, void* const* rows, uint32_t rows_per_chunk, uint32_t last_rows,
                         uint64_t row_bytes, int* per_entry);

#ifdef __cplusplus
}
#endif

#endif /* DPUKV_CLIENT_H */
