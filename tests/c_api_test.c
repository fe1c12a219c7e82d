/* The C ABI compiled as C: connects to the agent named by argv[1], stores and
 * retrieves two chunks, checks the bytes and the event feed's two stored events.
 * Exit 0 on success. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep under -std=c11 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dpukv/client.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  dpukv_client* c = NULL;
  int rc = dpukv_connect(argv[1], 0, &c);
  if (rc != 0) {
    fprintf(stderr, "connect: %s\n", dpukv_status_name(rc));
    return 3;
  }
  if (dpukv_subscribe_events(c) != 0) return 12; /* before the stores: their events */
  void* data = NULL;
  uint64_t id = 0;
  if (dpukv_alloc_staging(c, 1 << 20, &data, &id) != 0) return 4;
  int32_t tokens[512];
  for (int i = 0; i < 512; ++i) tokens[i] = i;
  dpukv_key keys[2];
  if (dpukv_chunk_keys(dpukv_model_id("c-model"), 1, 0, 0, tokens, 512, 256, 0, keys, 2) != 2)
    return 5;
  /* Per layer: the same prefix hashes, each row under its own layout. */
  uint64_t layouts[3] = {0, 7, 9};
  dpukv_key rows[3][2];
  if (dpukv_chunk_keys_layers(dpukv_model_id("c-model"), 1, 0, layouts, 3, tokens, 512, 256, 0,
                              &rows[0][0], 2) != 2)
    return 30;
  for (int l = 0; l < 3; ++l)
    for (int i = 0; i < 2; ++i)
      if (rows[l][i].layout != layouts[l] || rows[l][i].prefix_hash != keys[i].prefix_hash ||
          rows[l][i].model != keys[i].model)
        return 31;
  uint64_t offs[2] = {0, 65536}, lens[2] = {65536, 65536};
  memset(data, 0x5a, 131072);
  int st[2];
  if (dpukv_store(c, id, keys, offs, lens, 2, st) != 0) return 6;
  if (dpukv_lookup(c, keys, 2, 0) != 2) return 7;
  memset(data, 0, 131072);
  if (dpukv_retrieve(c, id, keys, offs, lens, 2, st) != 0) return 8;
  for (int i = 0; i < 131072; ++i)
    if (((unsigned char*)data)[i] != 0x5a) return 9;
  /* The event feed: the two stored chunks, as they arrive (batched by the agent). */
  dpukv_event ev[8];
  uint32_t got = 0;
  int lost = 0;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (got < 2) {
    uint32_t n = 0;
    if (dpukv_take_events(c, ev + got, 8 - got, &n, &lost) != 0) return 13;
    got += n;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > 30) {
      fprintf(stderr, "events: %u of 2 after 30 s\n", got);
      return 14;
    }
    if (n == 0) {
      struct timespec d = {0, 1000000};
      nanosleep(&d, NULL);
    }
  }
  for (uint32_t i = 0; i < 2; ++i)
    if (!ev[i].stored || (memcmp(&ev[i].key, &keys[0], sizeof(dpukv_key)) != 0 &&
                          memcmp(&ev[i].key, &keys[1], sizeof(dpukv_key)) != 0))
      return 15;
  /* Asynchronous: a retrieve polled (never blocking) until done, its ticket then
   * spent; per-key calls; the staging limit; keys from block ids. */
  memset(data, 0, 131072);
  uint64_t ticket = 0;
  int ast[2] = {-1, -1}, done = 0;
  if (dpukv_submit_retrieve(c, id, keys, offs, lens, 2, ast, &ticket) != 0) return 16;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!done) {
    rc = dpukv_poll(c, ticket, &done);
    if (!done && strcmp(dpukv_status_name(rc), "IN_PROGRESS") != 0) return 17;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > 30) return 18;
  }
  if (rc != 0 || ast[0] != 0 || ast[1] != 0 || ((unsigned char*)data)[65536] != 0x5a) return 19;
  if (strcmp(dpukv_status_name(dpukv_wait(c, ticket)), "NOT_FOUND") != 0) return 20;
  dpukv_key more[3] = {keys[0], keys[1], keys[1]};
  more[2].prefix_hash ^= 1; /* a key no chunk has */
  int per[3];
  if (dpukv_contains(c, more, 3, per) != 0 || per[0] != 0 || per[1] != 0 ||
      strcmp(dpukv_status_name(per[2]), "NOT_FOUND") != 0)
    return 21;
  if (dpukv_prefetch(c, more, 2, per) != 0 || dpukv_max_staging_bytes(c) < (1u << 20)) return 22;
  uint64_t ids[2] = {7, 8};
  dpukv_key byid[2];
  if (dpukv_keys_from_block_ids(dpukv_model_id("c-model"), ids, 2, byid) != 2 ||
      byid[0].prefix_hash == byid[1].prefix_hash)
    return 23;
  /* The GPU export entry points: an agent without a GPU path says so. */
  uint64_t gid = 0;
  if (!dpukv_agent_gpu(c)) {
    rc = dpukv_export_gpu(c, 0x100000, 4096, 0, &gid);
    if (strcmp(dpukv_status_name(rc), "NOT_SUPPORTED") != 0) {
      fprintf(stderr, "export_gpu without a GPU path: %s\n", dpukv_status_name(rc));
      return 10;
    }
    if (strcmp(dpukv_status_name(dpukv_release_gpu(c, 12345)), "NOT_FOUND") != 0) return 11;
  }
  dpukv_close(c);
  printf("c api: ok\n");
  return 0;
}
