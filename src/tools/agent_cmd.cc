#include "tools/agent_cmd.h"

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
#include "cache/eviction_policy.h"
#include "client/client.h"
#include "protocol/version.h"
#include "runtime/host_port.h"
#include "runtime/log.h"
#include "tools/arg_parse.h"
#include "tools/bench_common.h"

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

uint64_t available_ram() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  uint64_t v;
  std::string unit;
  while (f >> k >> v >> unit)
    if (k == "MemAvailable:") return v * 1024;
  return 4ull << 30;
}

// Every setting the agent takes, by its config-file name (LMCache's where the
// concept is the same). A value is kept as text with where it came from, and is
// parsed once, after flags > environment > config file have been merged, by the
// one parser of its kind (tools/arg_parse.h). examples/agent.yaml documents each.
enum class Kind { kText, kGib, kBytes, kCount, kPort, kBool, kChoice };
struct Setting {
  const char* name;
  const char* env;  // DPUKV_* variable, or null
  Kind kind;
  uint64_t max;         // kCount: largest value
  const char* choices;  // kChoice: "a|b"
  std::string value;    // text as given
  std::string origin;   // "--flag", "DPUKV_X", "FILE:LINE", or "" for the default
};

// The eviction setting's choices and help, from the cache's policy table.
const char* eviction_choices() {
  static const std::string choices = eviction_policy_names("|");
  return choices.c_str();
}
const char* eviction_help() {
  static const std::string help = [] {
    std::string h = "Eviction policy:";
    for (const EvictionPolicyInfo& p : eviction_policies())
      h += std::string(h.back() == ':' ? " " : "; ") + p.name + " (" + p.summary + ")";
    return h + " (default " + eviction_policies()[0].name + ")";
  }();
  return help.c_str();
}

struct Settings {
  std::vector<Setting> all = {
      {"socket", "DPUKV_SOCKET", Kind::kText, 0, nullptr, "", ""},
      {"chunk_size", "DPUKV_CHUNK_SIZE", Kind::kCount, 1u << 20, nullptr, "256", ""},
      {"max_local_cpu_size", "DPUKV_MAX_LOCAL_CPU_SIZE", Kind::kGib, 0, nullptr, "", ""},
      {"memory_bytes", nullptr, Kind::kBytes, 0, nullptr, "", ""},
      {"local_disk", "DPUKV_LOCAL_DISK", Kind::kText, 0, nullptr, "", ""},
      {"max_local_disk_size", "DPUKV_MAX_LOCAL_DISK_SIZE", Kind::kGib, 0, nullptr, "", ""},
      {"nvme_tier", nullptr, Kind::kText, 0, nullptr, "", ""},
      {"nvme_tier_nqn", nullptr, Kind::kText, 0, nullptr, "nqn.2026-11.io.dpukv:cnode1", ""},
      {"max_chunk_size", nullptr, Kind::kBytes, 0, nullptr, "64M", ""},
      {"max_chunks", nullptr, Kind::kCount, 1u << 30, nullptr, "0", ""},
      {"dma_threads", nullptr, Kind::kCount, 64, nullptr, "1", ""},
      {"max_requests", nullptr, Kind::kCount, 1u << 20, nullptr, "1024", ""},
      {"compress", nullptr, Kind::kBool, 0, nullptr, "false", ""},
      {"eviction", nullptr, Kind::kChoice, 0, eviction_choices(), eviction_policies()[0].name, ""},
      {"metrics_port", "DPUKV_METRICS_PORT", Kind::kPort, 0, nullptr, "9464", ""},
      {"metrics_address", "DPUKV_METRICS_ADDRESS", Kind::kText, 0, nullptr, "127.0.0.1", ""},
      {"write_through", nullptr, Kind::kBool, 0, nullptr, "false", ""},
      {"disk_admit_hits", nullptr, Kind::kCount, 1u << 30, nullptr, "0", ""},
      {"pin_timeout_ms", nullptr, Kind::kCount, 24u * 3600 * 1000, nullptr, "30000", ""},
      {"max_staging_size", "DPUKV_MAX_STAGING_SIZE", Kind::kGib, 0, nullptr, "", ""},
      {"cluster", "DPUKV_CLUSTER", Kind::kText, 0, nullptr, "", ""},
      {"cluster_prefix", "DPUKV_CLUSTER_PREFIX", Kind::kText, 0, nullptr, "dpukv", ""},
      {"cluster_password_file", "DPUKV_CLUSTER_PASSWORD_FILE", Kind::kText, 0, nullptr, "", ""},
      {"cluster_lookup_timeout_ms", nullptr, Kind::kCount, 60000, nullptr, "500", ""},
      {"advertise", "DPUKV_ADVERTISE", Kind::kText, 0, nullptr, "", ""},
      {"remote_tier", nullptr, Kind::kChoice, 0, "none|redis", "none", ""},
      {"directory_replica_keys", nullptr, Kind::kCount, 1u << 28, nullptr, "1048576", ""},
      {"gpu", nullptr, Kind::kChoice, 0, "auto|off", "auto", ""},
      {"cuda_driver", nullptr, Kind::kText, 0, nullptr, "", ""},
  };
  Setting* find(const std::string& name) {
    for (Setting& s : all)
      if (name == s.name) return &s;
    return nullptr;
  }
  Setting& at(const char* name) { return *find(name); }
  bool given(const char* name) { return !at(name).origin.empty(); }
};

// "--flag 'x': why", "DPUKV_X='x': why" or "FILE:LINE: max_chunk_size 'x': why".
std::string where(const Setting& s) {
  if (s.origin.empty()) return std::string(s.name) + " (default)";
  if (s.origin[0] == '-' || s.origin.rfind("DPUKV_", 0) == 0) return s.origin;
  return s.origin + ": " + s.name;
}

// A config file of "name: value" lines (YAML's simple form, as LMCache's files use).
bool apply_config(const std::string& path, Settings* st) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    std::cerr << "dpukv agent: config " << path << ": "
              << (errno == 0 || S_ISDIR(sb.st_mode) ? "not a regular file" : std::strerror(errno))
              << "\n";
    return false;
  }
  std::ifstream f(path);
  if (!f) {
    std::cerr << "dpukv agent: cannot read config " << path << "\n";
    return false;
  }
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const size_t colon = line.find(':');
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (colon == std::string::npos) {
      std::cerr << path << ":" << n << ": expected 'name: value'\n";
      return false;
    }
    auto trim = [](std::string x) {
      x.erase(0, x.find_first_not_of(" \t\"'"));
      x.erase(x.find_last_not_of(" \t\"'\r") + 1);
      return x;
    };
    const std::string k = trim(line.substr(0, colon));
    std::string v = trim(line.substr(colon + 1));
    Setting* s = st->find(k);
    if (s == nullptr) {
      std::cerr << path << ":" << n << ": unknown setting '" << k
                << "' (see examples/agent.yaml for every setting)\n";
      return false;
    }
    if (k == "local_disk" && v.rfind("file://", 0) == 0) v = v.substr(7);
    s->value = v;
    s->origin = path + ":" + std::to_string(n);
  }
  return true;
}

void apply_env(Settings* st) {
  for (Setting& s : st->all) {
    if (s.env == nullptr) continue;
    const char* v = std::getenv(s.env);
    if (v == nullptr || *v == '\0') continue;
    s.value = v;
    s.origin = std::string(s.env);
  }
}

// Parses every setting by its kind; prints each bad one. False if any was bad.
bool check_all(Settings* st) {
  bool ok = true;
  for (const Setting& s : st->all) {
    if (s.value.empty()) continue;
    std::string err;
    uint64_t u = 0;
    int port = 0;
    bool b = false;
    bool good = true;
    switch (s.kind) {
      case Kind::kText:
        break;
      case Kind::kGib:
        good = parse_gib_size(s.value, &u, &err);
        break;
      case Kind::kBytes:
        good = parse_byte_size(s.value, &u, &err);
        break;
      case Kind::kCount:
        good = parse_count(s.value, s.max, &u, &err);
        break;
      case Kind::kPort:
        good = parse_port(s.value, &port, &err);
        break;
      case Kind::kBool:
        good = parse_bool(s.value, &b, &err);
        break;
      case Kind::kChoice: {
        const std::string c = std::string("|") + s.choices + "|";
        good = c.find("|" + s.value + "|") != std::string::npos;
        if (!good) err = "'" + s.value + "' is not one of " + s.choices;
        break;
      }
    }
    if (!good) {
      std::cerr << "dpukv agent: " << where(s) << ": " << err << "\n";
      ok = false;
    }
  }
  return ok;
}

uint64_t as_u64(Settings* st, const char* name) {
  Setting& s = st->at(name);
  std::string err;
  uint64_t v = 0;
  if (s.value.empty()) return 0;
  if (s.kind == Kind::kGib) (void)parse_gib_size(s.value, &v, &err);
  if (s.kind == Kind::kBytes) (void)parse_byte_size(s.value, &v, &err);
  if (s.kind == Kind::kCount) (void)parse_count(s.value, s.max, &v, &err);
  return v;
}
bool as_bool(Settings* st, const char* name) {
  bool b = false;
  std::string err;
  (void)parse_bool(st->at(name).value, &b, &err);
  return b;
}

std::string mib(uint64_t b) {
  char buf[32];
  if (b >= (10ull << 30))
    std::snprintf(buf, sizeof(buf), "%.1f GiB", b / 1073741824.0);
  else
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / 1048576.0);
  return buf;
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

// The interface that has addr (an IPv4 or IPv6 address), or "".
std::string interface_of(const std::string& addr) {
  in6_addr want6{};
  in_addr want4{};
  const bool v4 = inet_pton(AF_INET, addr.c_str(), &want4) == 1;
  const bool v6 = !v4 && inet_pton(AF_INET6, addr.c_str(), &want6) == 1;
  if (!v4 && !v6) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (v4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want4.s_addr)
      name = i->ifa_name;
    if (v6 && i->ifa_addr->sa_family == AF_INET6 &&
        std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &want6,
                    sizeof(want6)) == 0)
      name = i->ifa_name;
  }
  freeifaddrs(list);
  return name;
}

// A redis:// URL with its password (if any) replaced by ***, for logs and errors.
std::string masked_url(const std::string& url) {
  const size_t at = url.rfind('@');
  const size_t scheme = url.rfind("redis://", 0) == 0 ? 8 : 0;
  if (at == std::string::npos) return url;
  const size_t colon = url.find(':', scheme);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

// cluster (redis://[USER[:PASSWORD]@]HOST:PORT), cluster_password_file,
// cluster_prefix, advertise.
bool cluster_settings(Settings* st, AgentOptions* o) {
  std::string url = st->at("cluster").value;
  if (url.empty() && st->given("cluster")) {
    std::cerr << "dpukv agent: " << where(st->at("cluster"))
              << " is empty: give redis://HOST:PORT, or leave it out to run without a cluster\n";
    return false;
  }
  if (url.empty()) {
    if (st->at("remote_tier").value != "none") {
      std::cerr << "dpukv agent: " << where(st->at("remote_tier"))
                << " is set but cluster is not: the remote tier lives in the cluster's Redis "
                   "(give --cluster redis://HOST:PORT too)\n";
      return false;
    }
    if (st->given("advertise")) {
      std::cerr << "dpukv agent: " << where(st->at("advertise"))
                << " is set but cluster is not: give --cluster redis://HOST:PORT too\n";
      return false;
    }
    return true;
  }
  if (url.rfind("redis://", 0) == 0) url = url.substr(8);
  if (!url.empty() && url.back() == '/') url.pop_back();
  o->cluster = true;
  ClusterOptions& c = o->cluster_options;
  // redis://[USER[:PASSWORD]@]HOST:PORT (Redis ACL users; no user: the default one).
  std::string user, password;
  bool url_password = false;
  if (const size_t at = url.rfind('@'); at != std::string::npos) {
    const std::string info = url.substr(0, at);
    url = url.substr(at + 1);
    const size_t colon = info.find(':');
    user = info.substr(0, colon);
    if (colon != std::string::npos) {
      password = info.substr(colon + 1);
      url_password = true;
    }
  }
  if (url.empty() || url.find('/') != std::string::npos ||
      !parse_host_port(url, &c.redis_host, &c.redis_port, 6379) || c.redis_host.empty() ||
      c.redis_port == 0) {
    std::cerr << "dpukv agent: " << where(st->at("cluster")) << ": '"
              << masked_url(st->at("cluster").value)
              << "' is not redis://[USER[:PASSWORD]@]HOST:PORT with a port of 1-65535\n";
    return false;
  }
  // The password: from a file or the environment, which other users cannot read in
  // /proc/PID/cmdline as they can a flag.
  const Setting& file = st->at("cluster_password_file");
  const char* env_password = std::getenv("DPUKV_CLUSTER_PASSWORD");
  if (!file.value.empty()) {
    std::ifstream f(file.value);
    if (!f || !std::getline(f, password) || password.empty()) {
      std::cerr << "dpukv agent: " << where(file) << ": cannot read a password from '" << file.value
                << "'" << (f ? " (the file is empty)" : "") << "\n";
      return false;
    }
    if (!password.empty() && password.back() == '\r') password.pop_back();
  } else if (env_password != nullptr && *env_password != '\0') {
    password = env_password;
  } else if (url_password && st->at("cluster").origin.rfind("--", 0) == 0) {
    APP_LOG_WARN(
        "agent: the Redis password is on the command line, where every user of this host "
        "can read it (/proc/%d/cmdline); use cluster_password_file or DPUKV_CLUSTER_PASSWORD",
        static_cast<int>(::getpid()));
  }
  c.redis_user = user;
  c.redis_password = password;
  c.lookup_timeout_ms = static_cast<uint32_t>(as_u64(st, "cluster_lookup_timeout_ms"));
  if (c.lookup_timeout_ms == 0) {
    std::cerr << "dpukv agent: " << where(st->at("cluster_lookup_timeout_ms"))
              << ": must be at least 1 (ms)\n";
    return false;
  }
  c.prefix = st->at("cluster_prefix").value;
  c.remote_tier = st->at("remote_tier").value == "redis";
  c.replica_max_keys = as_u64(st, "directory_replica_keys");
  if (c.prefix.empty() || c.prefix.find_first_of(" \t\r\n") != std::string::npos) {
    std::cerr << "dpukv agent: " << where(st->at("cluster_prefix"))
              << ": must be a non-empty word\n";
    return false;
  }
  const std::string adv = st->at("advertise").value;
  if (!adv.empty()) {
    const std::string ifname = interface_of(adv);
    if (ifname.empty()) {
      std::cerr << "dpukv agent: " << where(st->at("advertise")) << ": no interface of this host "
                << "has the address '" << adv << "'\n";
      return false;
    }
    // UCX picks its network devices when the agent's UCX context is made. A device
    // list the user gave wins: an RDMA device (mlx5_0:1, rxe0:1) is not an interface.
    const char* given = getenv("UCX_NET_DEVICES");
    if (given == nullptr || *given == '\0') {
      (void)setenv("UCX_NET_DEVICES", ifname.c_str(), 1);
      APP_LOG_INFO("agent: peers reach this agent at %s (interface %s)", adv.c_str(),
                   ifname.c_str());
    } else {
      APP_LOG_INFO(
          "agent: peers reach this agent at %s (interface %s; UCX devices %s, as "
          "UCX_NET_DEVICES says)",
          adv.c_str(), ifname.c_str(), given);
    }
  }
  return true;
}

int run_agent(Settings st, const std::string& config) {
  // Precedence: flags > environment > config file > embedded defaults.
  Settings flags = st;
  if (!config.empty() && !apply_config(config, &st)) return 2;
  apply_env(&st);
  for (size_t i = 0; i < st.all.size(); ++i)
    if (!flags.all[i].origin.empty()) st.all[i] = flags.all[i];
  if (!check_all(&st)) return 2;

  AgentOptions o;
  o.socket_path = st.at("socket").value;
  // Checked before anything costly (the memory tier is pre-faulted at start).
  {
    const std::string path = o.socket_path.empty() ? default_socket_path() : o.socket_path;
    const size_t room = sizeof(sockaddr_un::sun_path) - 1;
    if (path.size() > room) {
      std::cerr << "dpukv agent: " << where(st.at("socket")) << ": '" << path << "' is "
                << path.size() << " bytes, too long for a UNIX socket (at most " << room << ")\n";
      return 2;
    }
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    struct stat sb {};
    if (::stat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      std::cerr << "dpukv agent: " << where(st.at("socket")) << ": the directory '" << dir
                << "' of '" << path << "' does not exist\n";
      return 2;
    }
  }
  if (as_u64(&st, "max_requests") == 0) {
    std::cerr << "dpukv agent: " << where(st.at("max_requests")) << ": must be at least 1\n";
    return 2;
  }
  o.cache.max_requests = static_cast<uint32_t>(as_u64(&st, "max_requests"));
  if (as_u64(&st, "dma_threads") == 0) {
    std::cerr << "dpukv agent: " << where(st.at("dma_threads")) << ": must be 1-64\n";
    return 2;
  }
  const uint64_t max_chunk = as_u64(&st, "max_chunk_size");
  if (max_chunk == 0) {
    std::cerr << "dpukv agent: " << where(st.at("max_chunk_size")) << ": must be above 0\n";
    return 2;
  }
  // Embedded default: a quarter of the available RAM, at most 4 GiB.
  uint64_t mem = std::min<uint64_t>(available_ram() / 4, 4ull << 30);
  const char* mem_from = "a quarter of the available memory, at most 4 GiB";
  if (!st.at("memory_bytes").value.empty()) {
    mem = as_u64(&st, "memory_bytes"), mem_from = "memory_bytes";
  } else if (!st.at("max_local_cpu_size").value.empty()) {
    mem = as_u64(&st, "max_local_cpu_size"), mem_from = "max_local_cpu_size";
  }
  if (mem < max_chunk) {
    std::cerr << "dpukv agent: the memory tier (" << mib(mem) << ", from " << mem_from
              << ") is smaller than max_chunk_size (" << mib(max_chunk)
              << "): raise the one or lower the other\n";
    return 2;
  }
  o.cache.memory_bytes = mem;
  o.cache.max_chunk_bytes = max_chunk;
  const std::string disk_dir = st.at("local_disk").value;
  const uint64_t disk = as_u64(&st, "max_local_disk_size");
  if (disk_dir.empty() && st.given("max_local_disk_size")) {
    std::cerr << "dpukv agent: " << where(st.at("max_local_disk_size"))
              << " is set but local_disk is not: there is no disk tier to size (give "
                 "--local-disk DIR too)\n";
    return 2;
  }
  if (!disk_dir.empty() && disk < max_chunk) {
    std::cerr << "dpukv agent: local_disk needs max_local_disk_size of at least one chunk ("
              << mib(max_chunk) << "); it is " << mib(disk) << "\n";
    return 2;
  }
  if (!st.at("nvme_tier").value.empty() && disk_dir.empty()) {
    std::cerr << "dpukv agent: --nvme-tier needs --local-disk (the tier's index log lives there)\n";
    return 2;
  }
  const uint64_t max_chunks = as_u64(&st, "max_chunks");
  o.cache.max_chunks =
      max_chunks
          ? static_cast<uint32_t>(max_chunks)
          : static_cast<uint32_t>(std::min<uint64_t>((mem + disk) / (16 << 10) + 1024, 16u << 20));
  o.cache.disk_dir = disk_dir;
  o.cache.disk_bytes = disk_dir.empty() ? 0 : disk;
  o.cache.nvme_address = st.at("nvme_tier").value;
  o.cache.nvme_nqn = st.at("nvme_tier_nqn").value;
  o.cache.write_through = as_bool(&st, "write_through");
  o.cache.dma.num_threads =
      std::max<uint32_t>(1, static_cast<uint32_t>(as_u64(&st, "dma_threads")));
  o.cache.compress = as_bool(&st, "compress");
  o.gpu.enabled = st.at("gpu").value != "off";
  o.gpu.driver_library = st.at("cuda_driver").value;
  // The GPU copies' checksums need more than a core where one core's DRAM bandwidth
  // trails the GPU's link (6 GB/s against 55 on the H200 machine): at least
  // min(4, CPUs / 4) threads, more with --dma-threads.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  o.gpu.hash_threads = std::max<uint32_t>(o.cache.dma.num_threads,
                                          static_cast<uint32_t>(std::clamp(cpus / 4, 1L, 4L)));
  if (CacheEngine::slot_bytes(o.cache) > mem) {
    std::cerr << "dpukv agent: with compress, a chunk of max_chunk_size (" << mib(max_chunk)
              << ") first takes a slot of the codec's worst case ("
              << CacheEngine::slot_bytes(o.cache) << " bytes), more than the memory tier (" << mem
              << " bytes, from " << mem_from
              << "): raise the memory tier or lower max_chunk_size\n";
    return 2;
  }
  // The embedded default is a whole number of slots: no "holds less than asked"
  // warning for a size nobody asked for.
  if (st.at("memory_bytes").value.empty() && st.at("max_local_cpu_size").value.empty()) {
    const uint64_t slot = CacheEngine::slot_bytes(o.cache);
    mem = mem / slot * slot;
    o.cache.memory_bytes = mem;
  }
  o.cache.policy = st.at("eviction").value;
  o.cache.disk_admit_hits = static_cast<uint32_t>(as_u64(&st, "disk_admit_hits"));
  o.cache.pin_timeout_ms = static_cast<uint32_t>(as_u64(&st, "pin_timeout_ms"));
  std::string err;
  (void)parse_port(st.at("metrics_port").value, &o.metrics_port, &err);
  o.metrics_address = st.at("metrics_address").value;
  o.max_staging_bytes = st.at("max_staging_size").value.empty()
                            ? std::max<uint64_t>(available_ram() / 2, 1ull << 30)
                            : as_u64(&st, "max_staging_size");

  if (!cluster_settings(&st, &o)) return 2;

  APP_LOG_INFO("dpukv agent %s starting (pid %d)", kDpukvVersion, static_cast<int>(::getpid()));
  for (const Setting& s : st.all)
    if (!s.value.empty())
      APP_LOG_INFO("  %-20s %s%s%s", s.name,
                   std::string(s.name) == "cluster" ? masked_url(s.value).c_str() : s.value.c_str(),
                   s.origin.empty() ? "" : "  (from ",
                   s.origin.empty() ? "" : (s.origin + ")").c_str());

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
                 mib(cs.memory_capacity).c_str(), mib(mem).c_str(),
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
    std::cerr << "dpukv agent: " << rc.name() << ": " << rc.description() << "\n";
    return 1;
  }
  return 0;
}

// Why no agent answered at path: said as a user can act on it.
std::string no_agent_at(const std::string& socket) {
  const std::string path = socket.empty() ? find_agent_socket() : socket;
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0)
    return "no agent at " + path + " (" + std::strerror(errno) + ")";
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
  std::printf("chunks         %llu (%llu in memory, %llu on disk, %llu of them in both)\n",
              (unsigned long long)u("chunks"), (unsigned long long)u("memory_chunks"),
              (unsigned long long)u("disk_chunks"), (unsigned long long)u("both_tier_chunks"));
  std::printf("memory tier    %s of %s\n", mib(u("memory_used_bytes")).c_str(),
              mib(u("memory_capacity_bytes")).c_str());
  if (u("disk_capacity_bytes"))
    std::printf("disk tier      %s of %s\n", mib(u("disk_used_bytes")).c_str(),
                mib(u("disk_capacity_bytes")).c_str());
  else
    std::printf("disk tier      none\n");
  std::printf("lookups        %llu keys, %.1f%% found, %.1f us mean per lookup\n",
              (unsigned long long)keys, keys ? 100.0 * hits / keys : 0.0,
              j.value("lookup_mean_us", 0.0));
  std::printf("stored         %llu chunks, %s\n", (unsigned long long)u("stores"),
              mib(u("store_bytes")).c_str());
  std::printf("retrieved      %llu chunks, %s (%llu misses)\n", (unsigned long long)u("retrieves"),
              mib(u("retrieve_bytes")).c_str(), (unsigned long long)u("misses"));
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
                (unsigned long long)u("gpu_copies"), mib(u("gpu_copy_bytes")).c_str(),
                (unsigned long long)u("gpu_copy_failures"));
  std::printf("\n");
  if (!j.contains("cluster_node")) {
    std::printf("cluster        none\n");
    return 0;
  }
  std::printf(
      "cluster        node %s, directory %s; replica %s, %llu chunks, %llu lookups answered "
      "from it (%llu rebuilds, %llu bad events)\n",
      j.value("cluster_node", std::string("?")).c_str(),
      u("cluster_directory_connected") ? "connected" : "UNREACHABLE (serving locally)",
      u("directory_replica_ready") ? "ready" : "not ready (lookups ask Redis)",
      (unsigned long long)u("directory_replica_keys"),
      (unsigned long long)u("directory_lookups_local"), (unsigned long long)u("directory_syncs"),
      (unsigned long long)u("directory_bad_events"));
  std::printf(
      "remote         %llu keys found on peers, %llu chunks read (%s); %llu stale, "
      "%llu broken reads, %llu bad copies, %llu timeouts\n",
      (unsigned long long)u("lookup_remote_hits"), (unsigned long long)u("remote_hits"),
      mib(u("remote_bytes")).c_str(), (unsigned long long)u("remote_stale"),
      (unsigned long long)u("remote_read_errors"),
      (unsigned long long)u("remote_checksum_failures"), (unsigned long long)u("remote_timeouts"));
  if (u("remote_tier_puts") || u("remote_tier_hits") || u("remote_tier_rejects") ||
      u("remote_tier_put_failures"))
    std::printf(
        "remote tier    %llu chunks written, %llu writes FAILED, %llu read (%s), %llu refused, "
        "%llu lookups after a holder failed\n",
        (unsigned long long)u("remote_tier_puts"),
        (unsigned long long)u("remote_tier_put_failures"),
        (unsigned long long)u("remote_tier_hits"), mib(u("remote_tier_bytes")).c_str(),
        (unsigned long long)u("remote_tier_rejects"),
        (unsigned long long)u("remote_tier_fallbacks"));
  if (u("directory_errors"))
    std::printf("directory      %llu commands refused by Redis or unanswered (see the log)\n",
                (unsigned long long)u("directory_errors"));
  std::printf("served         %llu chunks (%s) to peers; %llu bad messages from peers\n",
              (unsigned long long)u("served_chunks"), mib(u("served_bytes")).c_str(),
              (unsigned long long)u("bad_peer_messages"));
  for (const auto& p : j.value("peers", nlohmann::json::array()))
    std::printf("  peer %s  %-12s read %llu chunks (%s), served %llu (%s), %llu errors\n",
                p.value("node", std::string("?")).c_str(),
                p.value("connected", false) ? "connected" : "disconnected",
                (unsigned long long)p.value("fetched", uint64_t{0}),
                mib(p.value("fetched_bytes", uint64_t{0})).c_str(),
                (unsigned long long)p.value("served", uint64_t{0}),
                mib(p.value("served_bytes", uint64_t{0})).c_str(),
                (unsigned long long)p.value("errors", uint64_t{0}));
  return 0;
}

}  // namespace

void add_agent_commands(CLI::App* app, int* exit_code) {
  auto st = std::make_shared<Settings>();
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
      {"--eviction", "eviction", eviction_help()},
      {"--metrics-port", "metrics_port", "Prometheus metrics port (0: off; default 9464)"},
      {"--metrics-address", "metrics_address",
       "Address the metrics listener binds (default 127.0.0.1)"},
      {"--disk-admit-hits", "disk_admit_hits", "Only chunks hit this often go to disk"},
      {"--pin-timeout-ms", "pin_timeout_ms",
       "Lookup pins (a connector's lease on a hit) expire after this (default 30000)"},
      {"--max-staging-size", "max_staging_size",
       "Staging memory one client may export, GiB or bytes with a unit (default: half the "
       "available RAM)"},
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
    Settings s = *st;
    for (size_t i = 0; i < opts.size(); ++i) {
      if (opts[i].first->count() == 0) continue;
      Setting* x = s.find(opts[i].second);
      x->value = (*flag_values)[static_cast<size_t>(x - s.all.data())];
      x->origin = opts[i].first->get_name();
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
  CLI::App* cache = app->add_subcommand("cache", "Manage the chunks a running agent holds");
  cache->require_subcommand(1);
  CLI::App* clear = cache->add_subcommand(
      "clear", "Drop every chunk (of one model with --model) that is not in use or pinned");
  clear->add_option("--socket", *csock, "Agent socket");
  clear->add_option("--model", *model, "Only this model's chunks (its name, as clients give it)");
  clear->callback([csock, model, exit_code] {
    ClientOptions o;
    o.socket_path = *csock;
    o.connect_timeout_ms = 1000;
    o.model = model->empty() ? 0 : model_id(*model);
    std::unique_ptr<Client> c;
    uint64_t removed = 0;
    if (!Client::connect(o, &c).ok() || !c->clear(&removed).ok()) {
      std::cerr << "dpukv cache clear: " << no_agent_at(*csock) << "\n";
      *exit_code = 1;
      return;
    }
    std::printf("cleared %llu chunks\n", static_cast<unsigned long long>(removed));
    *exit_code = 0;
  });
}

}  // namespace dpukv
