#include "tools/agent/agent_cmd.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "agent/agent_settings.h"
#include "cache/eviction_policy.h"
#include "client/client.h"
#include "protocol/version.h"
#include "runtime/arg_parse.h"
#include "runtime/host_port.h"
#include "runtime/log.h"
#include "tools/common/bench_common.h"

namespace dpukv {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_hup{false};
void on_signal(int) {
  g_stop.store(true);
}
void on_hup(int) {
  g_hup.store(true);
}

// Readiness for systemd (Type=notify): one datagram to $NOTIFY_SOCKET.
void notify_systemd(const char* state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || (path[0] != '/' && path[0] != '@')) return;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(sa.sun_path)) return;
  std::memcpy(sa.sun_path, path, len);
  if (sa.sun_path[0] == '@') sa.sun_path[0] = '\0';  // abstract namespace
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)!::sendto(fd, state, std::strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&sa),
                  static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
  ::close(fd);
}

int run_agent(AgentSettings st, const std::string& config) {
  // Precedence: flags > environment > config file > embedded defaults.
  AgentSettings flags = st;
  if (!config.empty() && !apply_config_file(config, &st, std::cerr)) return 2;
  apply_environment(&st);
  for (size_t i = 0; i < st.all.size(); ++i)
    if (!flags.all[i].origin.empty()) st.all[i] = flags.all[i];
  if (!check_settings(st, std::cerr)) return 2;

  AgentOptions o;
  if (!agent_options_from_settings(&st, &o, std::cerr)) return 2;
  const uint64_t mem = o.cache.memory_bytes;

  APP_LOG_INFO("dpukv agent %s starting (pid %d)", kDpukvVersion, static_cast<int>(::getpid()));
  for (const AgentSetting& s : st.all) {
    if (s.value.empty()) continue;
    // One log line a setting: tenant rules, a line each in a file, joined by "; ".
    std::string v = std::string(s.name) == "cluster" ? masked_redis_url(s.value) : s.value;
    for (size_t nl; (nl = v.find('\n')) != std::string::npos;) v.replace(nl, 1, "; ");
    APP_LOG_INFO("  %-20s %s%s%s", s.name, v.c_str(), s.origin.empty() ? "" : "  (from ",
                 s.origin.empty() ? "" : (s.origin + ")").c_str());
  }

  std::unique_ptr<Agent> agent;
  Status rc = Agent::create(o, &agent);
  if (!rc.ok()) {
    // The logged cause ("metrics: cannot listen on ...: Address already in use"), not
    // only the code it became.
    const std::string why = log_last_error();
    std::cerr << "dpukv agent: cannot start: "
              << (why.empty() ? std::string(rc.description()) : why) << "\n";
    return 1;
  }
  const CacheStats cs = agent->cache_stats();
  if (cs.memory_capacity < mem)
    APP_LOG_WARN("agent: the memory tier holds %s of the %s asked (%s)",
                 size_text(cs.memory_capacity).c_str(), size_text(mem).c_str(),
                 o.cache.compress ? "with compress, slots are sized to the codec's worst case"
                                  : "whole slots of max_chunk_size");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction hup {};
  hup.sa_handler = on_hup;
  sigaction(SIGHUP, &hup, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (agent->metrics_port() > 0)
    APP_LOG_INFO("agent: metrics on http://%s:%d/metrics", o.metrics_address.c_str(),
                 agent->metrics_port());
  agent->set_on_ready([] { notify_systemd("READY=1"); });
  agent->set_on_tick([] {
    if (g_hup.exchange(false))
      APP_LOG_INFO("agent: SIGHUP: settings are read at start only; restart to change them");
  });
  rc = agent->run(&g_stop);
  notify_systemd("STOPPING=1");
  if (!rc.ok()) {
    // The logged cause ("another server is listening on ..."), not only its code.
    const std::string why = log_last_error();
    std::cerr << "dpukv agent: " << (why.empty() ? std::string(rc.description()) : why) << "\n";
    return 1;
  }
  return 0;
}

// Why no agent answered at path: said as a user can act on it.
std::string no_agent_at(const std::string& socket) {
  // The agent answered and refused (full, this user's share, not allowed): its words.
  if (const char* why = Client::last_connect_error(); std::strstr(why, " refused: ") != nullptr)
    return why;
  const std::string path = socket.empty() ? find_agent_socket() : socket;
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) {
    if (errno == EACCES)
      return "permission denied: this user cannot enter the directory of " + path +
             " (the unit's RuntimeDirectory is mode 0750: join the agent's group)";
    return "no agent at " + path + " (" + std::strerror(errno) + ")";
  }
  if (!S_ISSOCK(sb.st_mode)) return path + " is not a socket";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof(sa.sun_path) - 1);
  const int rc = fd < 0 ? -1 : ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (rc != 0 && (err == EACCES || err == EPERM))
    return "permission denied on " + path +
           " (the agent's socket is mode 0660: run as its user or join its group)";
  if (rc != 0 && err == ECONNREFUSED)
    return "no agent listens on " + path + " (a socket left by an agent that is gone)";
  return "the agent at " + path + " did not answer";
}

int run_stat(const std::string& socket, bool json) {
  ClientOptions o;
  o.socket_path = socket;
  o.connect_timeout_ms = 1000;
  std::unique_ptr<Client> c;
  std::string text;
  if (!Client::connect(o, &c).ok() || !c->stats_json(&text).ok()) {
    std::cerr << "dpukv stat: " << no_agent_at(socket) << "\n";
    return 1;
  }
  if (json) {
    std::cout << text << std::endl;
    return 0;
  }
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << "dpukv stat: unreadable answer\n";
    return 1;
  }
  auto u = [&](const char* k) { return j.value(k, uint64_t{0}); };
  const uint64_t keys = u("lookup_keys"), hits = u("lookup_hits");
  std::printf("agent          dpukv %s\n", j.value("version", std::string("?")).c_str());
  std::printf("clients        %llu connected (besides this one)\n",
              (unsigned long long)u("clients"));
  if (j.contains("tenant"))
    std::printf("tenant         %s%s\n", j.value("tenant", std::string("?")).c_str(),
                j.value("admin", false) ? " (admin: every tenant below)" : "");
  if (j.contains("tenants") && j["tenants"].is_array())
    for (const auto& t : j["tenants"]) {
      auto q = [&](const char* k) { return t.value(k, uint64_t{0}); };
      const std::string mq = q("memory_quota") ? " of " + size_text(q("memory_quota")) : "";
      const std::string dq = q("disk_quota") ? " of " + size_text(q("disk_quota")) : "";
      const std::string sq = q("staging_quota") ? " of " + size_text(q("staging_quota")) : "";
      std::printf(
          "  %-12s %llu chunks, memory %s%s, disk %s%s, %llu quota evictions, %llu clients, "
          "staging %s%s\n",
          t.value("name", std::string("?")).c_str(), (unsigned long long)q("chunks"),
          size_text(q("memory_bytes")).c_str(), mq.c_str(), size_text(q("disk_bytes")).c_str(),
          dq.c_str(), (unsigned long long)q("quota_evictions"), (unsigned long long)q("clients"),
          size_text(q("staging_bytes")).c_str(), sq.c_str());
    }
  std::printf("chunks         %llu (%llu in memory, %llu on disk, %llu of them in both)\n",
              (unsigned long long)u("chunks"), (unsigned long long)u("memory_chunks"),
              (unsigned long long)u("disk_chunks"), (unsigned long long)u("both_tier_chunks"));
  std::printf("memory tier    %s of %s\n", size_text(u("memory_used_bytes")).c_str(),
              size_text(u("memory_capacity_bytes")).c_str());
  if (u("disk_capacity_bytes"))
    std::printf("disk tier      %s of %s\n", size_text(u("disk_used_bytes")).c_str(),
                size_text(u("disk_capacity_bytes")).c_str());
  else
    std::printf("disk tier      none\n");
  std::printf("lookups        %llu keys, %.1f%% found, %.1f us mean per lookup\n",
              (unsigned long long)keys, keys ? 100.0 * hits / keys : 0.0,
              j.value("lookup_mean_us", 0.0));
  std::printf("stored         %llu chunks, %s\n", (unsigned long long)u("stores"),
              size_text(u("store_bytes")).c_str());
  std::printf("retrieved      %llu chunks, %s (%llu misses)\n", (unsigned long long)u("retrieves"),
              size_text(u("retrieve_bytes")).c_str(), (unsigned long long)u("misses"));
  std::printf("evictions      %llu from memory, %llu from disk (spills %llu, reloads %llu)\n",
              (unsigned long long)u("evictions"), (unsigned long long)u("disk_evictions"),
              (unsigned long long)u("spills"), (unsigned long long)u("reloads"));
  std::printf(
      "rejected       %llu stores (no room), %llu not permitted, %llu bad requests, %llu "
      "protocol errors\n",
      (unsigned long long)u("store_rejects"), (unsigned long long)u("not_permitted"),
      (unsigned long long)u("bad_requests"), (unsigned long long)u("protocol_errors"));
  std::printf("disk errors    %llu checksum, %llu I/O, %llu index log\n",
              (unsigned long long)u("checksum_failures"), (unsigned long long)u("io_errors"),
              (unsigned long long)u("disk_log_errors"));
  std::printf("gpu path       %s", j.value("gpu_path", std::string("?")).c_str());
  if (u("gpu_on"))
    std::printf("; %llu exports (%llu refused), %llu copies (%s), %llu FAILED",
                (unsigned long long)u("gpu_exports"), (unsigned long long)u("gpu_exports_refused"),
                (unsigned long long)u("gpu_copies"), size_text(u("gpu_copy_bytes")).c_str(),
                (unsigned long long)u("gpu_copy_failures"));
  std::printf("\n");
  if (!j.contains("cluster_node")) {
    std::printf("cluster        none\n");
    return 0;
  }
  const std::string dir_state =
      u("cluster_directory_connected")
          ? "connected"
          : "UNREACHABLE (serving locally: " +
                j.value("cluster_directory_error", std::string("no answer")) + ")";
  std::printf(
      "cluster        node %s, directory %s; replica %s, %llu chunks, %llu lookups answered "
      "from it (%llu rebuilds, %llu bad events)\n",
      j.value("cluster_node", std::string("?")).c_str(), dir_state.c_str(),
      u("directory_replica_ready") ? "ready" : "not ready (lookups ask Redis)",
      (unsigned long long)u("directory_replica_keys"),
      (unsigned long long)u("directory_lookups_local"), (unsigned long long)u("directory_syncs"),
      (unsigned long long)u("directory_bad_events"));
  std::printf(
      "remote         %llu keys found on peers, %llu chunks read (%s); %llu stale, "
      "%llu broken reads, %llu bad copies, %llu timeouts\n",
      (unsigned long long)u("lookup_remote_hits"), (unsigned long long)u("remote_hits"),
      size_text(u("remote_bytes")).c_str(), (unsigned long long)u("remote_stale"),
      (unsigned long long)u("remote_read_errors"),
      (unsigned long long)u("remote_checksum_failures"), (unsigned long long)u("remote_timeouts"));
  if (u("remote_tier_puts") || u("remote_tier_hits") || u("remote_tier_rejects") ||
      u("remote_tier_put_failures"))
    std::printf(
        "remote tier    %llu chunks written, %llu writes FAILED, %llu read (%s), %llu refused, "
        "%llu lookups after a holder failed\n",
        (unsigned long long)u("remote_tier_puts"),
        (unsigned long long)u("remote_tier_put_failures"),
        (unsigned long long)u("remote_tier_hits"), size_text(u("remote_tier_bytes")).c_str(),
        (unsigned long long)u("remote_tier_rejects"),
        (unsigned long long)u("remote_tier_fallbacks"));
  if (u("directory_errors"))
    std::printf("directory      %llu commands refused by Redis or unanswered (see the log)\n",
                (unsigned long long)u("directory_errors"));
  std::printf("served         %llu chunks (%s) to peers; %llu bad messages from peers\n",
              (unsigned long long)u("served_chunks"), size_text(u("served_bytes")).c_str(),
              (unsigned long long)u("bad_peer_messages"));
  for (const auto& p : j.value("peers", nlohmann::json::array()))
    std::printf("  peer %s  %-12s read %llu chunks (%s), served %llu (%s), %llu errors\n",
                p.value("node", std::string("?")).c_str(),
                p.value("connected", false) ? "connected" : "disconnected",
                (unsigned long long)p.value("fetched", uint64_t{0}),
                size_text(p.value("fetched_bytes", uint64_t{0})).c_str(),
                (unsigned long long)p.value("served", uint64_t{0}),
                size_text(p.value("served_bytes", uint64_t{0})).c_str(),
                (unsigned long long)p.value("errors", uint64_t{0}));
  return 0;
}

}  // namespace

void add_agent_commands(CLI::App* app, int* exit_code) {
  auto st = std::make_shared<AgentSettings>(default_agent_settings());
  auto flag_values = std::make_shared<std::vector<std::string>>(st->all.size());
  auto config = std::make_shared<std::string>();
  auto parent = std::make_shared<int>(0);
  CLI::App* cmd =
      app->add_subcommand("agent", "Run the offload agent (the cache daemon) until SIGTERM/SIGINT");
  struct Flag {
    const char* flag;
    const char* name;
    const char* help;
  };
  static const Flag kFlags[] = {
      {"--socket", "socket",
       "UNIX socket path (default: $XDG_RUNTIME_DIR/dpukv.sock or /run/dpukv.sock)"},
      {"--max-local-cpu-size", "max_local_cpu_size",
       "Memory tier: GiB as a number (0.25), or bytes with a unit (512M) (default: 1/4 of "
       "available RAM, at most 4 GiB)"},
      {"--memory-bytes", "memory_bytes", "Exact memory tier size in bytes (K/M/G)"},
      {"--local-disk", "local_disk", "Disk tier directory (default: no disk tier)"},
      {"--max-local-disk-size", "max_local_disk_size",
       "Disk tier: GiB as a number, or bytes with a unit (needs --local-disk)"},
      {"--nvme-tier", "nvme_tier",
       "Put the disk tier's data on an NVMe/TCP namespace at ADDR:PORT (the index log stays in "
       "--local-disk)"},
      {"--nvme-tier-nqn", "nvme_tier_nqn", "Subsystem NQN of the NVMe tier"},
      {"--max-chunk-size", "max_chunk_size", "Largest chunk (K/M/G; default 64M)"},
      {"--max-chunks", "max_chunks", "Index capacity in chunks (default: tiers / 16 KiB)"},
      {"--dma-threads", "dma_threads",
       "Software engine threads: the DMA engine's (1-64; default 1); GPU copies are "
       "checksummed on as many, and at least min(4, CPUs / 4)"},
      {"--max-requests", "max_requests",
       "Chunk stores and retrieves in flight in the cache; a larger batch waits for room "
       "(default 1024)"},
      {"--eviction", "eviction", eviction_setting_help()},
      {"--metrics-port", "metrics_port", "Prometheus metrics port (0: off; default 9464)"},
      {"--metrics-address", "metrics_address",
       "Address the metrics listener binds (default 127.0.0.1)"},
      {"--disk-admit-hits", "disk_admit_hits", "Only chunks hit this often go to disk"},
      {"--pin-timeout-ms", "pin_timeout_ms",
       "Lookup pins (a connector's lease on a hit) expire after this (default 30000)"},
      {"--max-clients", "max_clients",
       "Client connections (default 1024; lowered to fit the descriptor limit)"},
      {"--max-clients-per-uid", "max_clients_per_uid",
       "One uid's share of the connections (default 256; 0: no share limit)"},
      {"--tenant-by", "tenant_by",
       "The tenant of a client no --tenant rule names: user (one a user, the default), group "
       "(one a primary group), shared (one for everyone), refuse"},
      {"--tenant-admin-group", "tenant_admin_group",
       "Members may clear and watch every tenant (besides root and the agent's user)"},
      {"--tenant-memory-quota", "tenant_memory_quota",
       "Each tenant's share of the memory tier, bytes with a unit (default: none)"},
      {"--tenant-staging-quota", "tenant_staging_quota",
       "Staging memory each tenant's clients may export together, bytes with a unit (default: "
       "none)"},
      {"--tenant-disk-quota", "tenant_disk_quota",
       "Each tenant's share of the disk tier, bytes with a unit (default: none)"},
      {"--max-staging-size", "max_staging_size",
       "Staging memory one client may export, host and GPU together, GiB or bytes with a unit "
       "(default: half the available RAM)"},
      {"--max-staging-total", "max_staging_total",
       "Staging memory all clients together may export (default: half the available RAM, at "
       "least --max-staging-size)"},
      {"--cluster", "cluster",
       "Join the cluster whose directory is this Redis: redis://[USER@]HOST:PORT (default: no "
       "cluster). The Redis must be private to the cluster: whoever can write to it can "
       "withdraw or misdirect chunks"},
      {"--cluster-password-file", "cluster_password_file",
       "File whose first line is the Redis password (AUTH; also DPUKV_CLUSTER_PASSWORD); not "
       "given on the command line, where other users can read it"},
      {"--cluster-prefix", "cluster_prefix", "Redis key prefix of the cluster (default dpukv)"},
      {"--cluster-lookup-timeout-ms", "cluster_lookup_timeout_ms",
       "A directory lookup Redis has not answered by then is a miss, and Redis is taken for "
       "hung and reconnected (1-60000, default 500)"},
      {"--remote-tier", "remote_tier",
       "none, or redis: also keep every stored chunk as a value in the cluster's Redis and look "
       "there for chunks no live agent holds (needs --cluster; default none)"},
      {"--directory-replica-keys", "directory_replica_keys",
       "Chunks this agent's replica of the directory may hold, about 110 bytes each; lookups "
       "ask Redis beyond it, 0: always (default 1048576)"},
      {"--gpu", "gpu",
       "auto: copy to and from clients' GPU memory when a CUDA driver and device are there "
       "(else host memory only, and `dpukv stat` says why); off: never load a driver "
       "(default auto)"},
      {"--cuda-driver", "cuda_driver",
       "The CUDA driver library to load (default: $DPUKV_CUDA_DRIVER, else libcuda.so.1)"},
      {"--gpu-checksum", "gpu_checksum",
       "Where GPU copies are checksummed: auto (on the GPU, by a kernel the agent loads and "
       "checks at start, else on host threads), gpu (the GPU, or the agent does not start), "
       "host (host threads) (default auto)"},
      {"--advertise", "advertise",
       "Address other agents reach this one at: peers' reads go over the interface that has it "
       "(default: every interface UCX finds)"},
  };
  std::vector<std::pair<CLI::Option*, std::string>> opts;
  for (const Flag& f : kFlags) {
    size_t idx = 0;
    while (std::string(st->all[idx].name) != f.name) ++idx;
    opts.emplace_back(cmd->add_option(f.flag, (*flag_values)[idx], f.help), f.name);
  }
  auto tenant_rules = std::make_shared<std::vector<std::string>>();
  CLI::Option* tenant_opt = cmd->add_option(
      "--tenant", *tenant_rules,
      "A tenant rule, repeatable: 'NAME uid:N user:NAME gid:N group:NAME socket:PATH "
      "memory:SIZE disk:SIZE' (docs/cli.md, Tenants)");
  auto compress = std::make_shared<bool>(false);
  auto write_through = std::make_shared<bool>(false);
  cmd->add_flag("--compress", *compress,
                "Encode chunks (lossless KV codec, bf16) on the compress engine before storing");
  cmd->add_flag("--write-through", *write_through,
                "Write every chunk to the disk tier at once (default: on eviction)");
  cmd->add_option("--config", *config,
                  "Config file of 'name: value' lines (every setting: examples/agent.yaml)");
  cmd->add_option("--parent-pid", *parent,
                  "Exit when this process does (for tools that start an agent of their own)")
      ->group("");
  cmd->callback([=] {
    if (*parent > 0) {
      // Tied to the parent: SIGTERM when it dies, checked once against the race
      // of it dying before the request took effect.
      (void)prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != *parent) {
        *exit_code = 1;
        return;
      }
    }
    AgentSettings s = *st;
    for (size_t i = 0; i < opts.size(); ++i) {
      if (opts[i].first->count() == 0) continue;
      AgentSetting* x = s.find(opts[i].second);
      x->value = (*flag_values)[static_cast<size_t>(x - s.all.data())];
      x->origin = opts[i].first->get_name();
    }
    if (tenant_opt->count() > 0) {
      std::string rules;
      for (const std::string& r : *tenant_rules) rules += (rules.empty() ? "" : "\n") + r;
      s.at("tenant").value = rules;
      s.at("tenant").origin = "--tenant";
    }
    if (*compress) s.at("compress").value = "true", s.at("compress").origin = "--compress";
    if (*write_through)
      s.at("write_through").value = "true", s.at("write_through").origin = "--write-through";
    *exit_code = run_agent(s, *config);
  });

  auto socket = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* stat = app->add_subcommand("stat", "Print a summary of a running agent");
  stat->add_option("--socket", *socket, "Agent socket");
  stat->add_flag("--json", *json, "Print the agent's JSON");
  stat->callback([socket, json, exit_code] { *exit_code = run_stat(*socket, *json); });

  auto csock = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>();
  auto every_tenant = std::make_shared<bool>(false);
  CLI::App* cache = app->add_subcommand("cache", "Manage the chunks a running agent holds");
  cache->require_subcommand(1);
  CLI::App* clear = cache->add_subcommand(
      "clear",
      "Drop every chunk of your tenant (of one model with --model) that is not in use or pinned");
  clear->add_option("--socket", *csock, "Agent socket");
  clear->add_option("--model", *model, "Only this model's chunks (its name, as clients give it)");
  clear->add_flag("--all-tenants", *every_tenant,
                  "Every tenant's chunks (an admin's: root, the agent's user, tenant_admin_group)");
  clear->callback([csock, model, every_tenant, exit_code] {
    ClientOptions o;
    o.socket_path = *csock;
    o.connect_timeout_ms = 1000;
    o.model = model->empty() ? 0 : model_id(*model);
    std::unique_ptr<Client> c;
    uint64_t removed = 0;
    if (!Client::connect(o, &c).ok()) {
      std::cerr << "dpukv cache clear: " << no_agent_at(*csock) << "\n";
      *exit_code = 1;
      return;
    }
    const Status cleared = c->clear(&removed, *every_tenant);
    if (cleared == Code::kNotPermitted) {
      std::cerr << "dpukv cache clear: only an admin may clear every tenant (root, the agent's "
                   "user, or a member of its tenant_admin_group)\n";
      *exit_code = 1;
      return;
    }
    if (!cleared.ok()) {
      std::cerr << "dpukv cache clear: " << no_agent_at(*csock) << "\n";
      *exit_code = 1;
      return;
    }
    std::printf("cleared %llu chunks\n", static_cast<unsigned long long>(removed));
    *exit_code = 0;
  });
}

}  // namespace dpukv
