#include "agent/agent_settings.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>

#include "cache/eviction_policies.h"
#include "runtime/arg_parse.h"
#include "runtime/host_port.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

uint64_t available_ram() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  uint64_t v;
  std::string unit;
  while (f >> k >> v >> unit)
    if (k == "MemAvailable:") return v * 1024;
  return 4ull << 30;
}

uint64_t as_u64(AgentSettings* st, const char* name) {
  AgentSetting& s = st->at(name);
  std::string err;
  uint64_t v = 0;
  if (s.value.empty()) return 0;
  if (s.kind == SettingKind::kGib) (void)parse_gib_size(s.value, &v, &err);
  if (s.kind == SettingKind::kBytes) (void)parse_byte_size(s.value, &v, &err);
  if (s.kind == SettingKind::kCount) (void)parse_count(s.value, s.max, &v, &err);
  return v;
}
bool as_bool(AgentSettings* st, const char* name) {
  bool b = false;
  std::string err;
  (void)parse_bool(st->at(name).value, &b, &err);
  return b;
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

// The eviction setting's choices, from the cache's policy table.
const char* eviction_choices() {
  static const std::string choices = eviction_policy_names("|");
  return choices.c_str();
}

}  // namespace

std::string size_text(uint64_t b) {
  char buf[32];
  if (b >= (10ull << 30))
    std::snprintf(buf, sizeof(buf), "%.1f GiB", b / 1073741824.0);
  else
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / 1048576.0);
  return buf;
}

const char* eviction_setting_help() {
  static const std::string help = [] {
    std::string h = "Eviction policy:";
    for (const EvictionPolicyInfo& p : eviction_policies())
      h += std::string(h.back() == ':' ? " " : "; ") + p.name + " (" + p.summary + ")";
    return h + " (default " + eviction_policies()[0].name + ")";
  }();
  return help.c_str();
}

AgentSettings default_agent_settings() {
  AgentSettings st;
  st.all = {
      {"socket", "DPUKV_SOCKET", SettingKind::kText, 0, nullptr, "", ""},
      {"chunk_size", "DPUKV_CHUNK_SIZE", SettingKind::kCount, 1u << 20, nullptr, "256", ""},
      {"max_local_cpu_size", "DPUKV_MAX_LOCAL_CPU_SIZE", SettingKind::kGib, 0, nullptr, "", ""},
      {"memory_bytes", nullptr, SettingKind::kBytes, 0, nullptr, "", ""},
      {"local_disk", "DPUKV_LOCAL_DISK", SettingKind::kText, 0, nullptr, "", ""},
      {"max_local_disk_size", "DPUKV_MAX_LOCAL_DISK_SIZE", SettingKind::kGib, 0, nullptr, "", ""},
      {"nvme_tier", nullptr, SettingKind::kText, 0, nullptr, "", ""},
      {"nvme_tier_nqn", nullptr, SettingKind::kText, 0, nullptr, "nqn.2026-11.io.dpukv:cnode1", ""},
      {"max_chunk_size", nullptr, SettingKind::kBytes, 0, nullptr, "64M", ""},
      {"max_chunks", nullptr, SettingKind::kCount, 1u << 30, nullptr, "0", ""},
      {"dma_threads", nullptr, SettingKind::kCount, 64, nullptr, "1", "", 1},
      {"max_requests", nullptr, SettingKind::kCount, 1u << 20, nullptr, "1024", ""},
      {"compress", nullptr, SettingKind::kBool, 0, nullptr, "false", ""},
      {"eviction", nullptr, SettingKind::kChoice, 0, eviction_choices(),
       eviction_policies()[0].name, ""},
      {"metrics_port", "DPUKV_METRICS_PORT", SettingKind::kPort, 0, nullptr, "9464", ""},
      {"metrics_address", "DPUKV_METRICS_ADDRESS", SettingKind::kText, 0, nullptr, "127.0.0.1", ""},
      {"write_through", nullptr, SettingKind::kBool, 0, nullptr, "false", ""},
      {"disk_admit_hits", nullptr, SettingKind::kCount, 1u << 30, nullptr, "0", ""},
      {"pin_timeout_ms", nullptr, SettingKind::kCount, 24u * 3600 * 1000, nullptr, "30000", ""},
      {"max_clients", nullptr, SettingKind::kCount, 1u << 20, nullptr, "1024", "", 1},
      {"max_clients_per_uid", nullptr, SettingKind::kCount, 1u << 20, nullptr, "256", ""},
      {"tenant_by", nullptr, SettingKind::kChoice, 0, "user|group|shared|refuse", "user", ""},
      {"tenant", nullptr, SettingKind::kText, 0, nullptr, "", ""},  // a rule a line
      {"tenant_admin_group", nullptr, SettingKind::kText, 0, nullptr, "", ""},
      {"tenant_memory_quota", nullptr, SettingKind::kBytes, 0, nullptr, "", ""},
      {"tenant_disk_quota", nullptr, SettingKind::kBytes, 0, nullptr, "", ""},
      {"tenant_staging_quota", nullptr, SettingKind::kBytes, 0, nullptr, "", ""},
      {"max_staging_size", "DPUKV_MAX_STAGING_SIZE", SettingKind::kGib, 0, nullptr, "", ""},
      {"max_staging_total", "DPUKV_MAX_STAGING_TOTAL", SettingKind::kGib, 0, nullptr, "", ""},
      {"cluster", "DPUKV_CLUSTER", SettingKind::kText, 0, nullptr, "", ""},
      {"cluster_prefix", "DPUKV_CLUSTER_PREFIX", SettingKind::kText, 0, nullptr, "dpukv", ""},
      {"cluster_password_file", "DPUKV_CLUSTER_PASSWORD_FILE", SettingKind::kText, 0, nullptr, "",
       ""},
      {"cluster_lookup_timeout_ms", nullptr, SettingKind::kCount, 60000, nullptr, "500", ""},
      {"advertise", "DPUKV_ADVERTISE", SettingKind::kText, 0, nullptr, "", ""},
      {"remote_tier", nullptr, SettingKind::kChoice, 0, "none|redis", "none", ""},
      {"directory_replica_keys", nullptr, SettingKind::kCount, 1u << 28, nullptr, "1048576", ""},
      {"gpu", nullptr, SettingKind::kChoice, 0, "auto|off", "auto", ""},
      {"cuda_driver", nullptr, SettingKind::kText, 0, nullptr, "", ""},
      {"gpu_checksum", nullptr, SettingKind::kChoice, 0, "auto|gpu|host", "auto", ""},
  };
  return st;
}

// "--flag 'x': why", "DPUKV_X='x': why" or "FILE:LINE: max_chunk_size 'x': why".
std::string setting_origin(const AgentSetting& s) {
  if (s.origin.empty()) return std::string(s.name) + " (default)";
  if (s.origin[0] == '-' || s.origin.rfind("DPUKV_", 0) == 0) return s.origin;
  return s.origin + ": " + s.name;
}

// A config file of "name: value" lines (YAML's simple form, as LMCache's files use).
bool apply_config_file(const std::string& path, AgentSettings* st, std::ostream& why) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    why << "dpukv agent: config " << path << ": "
        << (errno == 0 || S_ISDIR(sb.st_mode) ? "not a regular file" : std::strerror(errno))
        << "\n";
    return false;
  }
  std::ifstream f(path);
  if (!f) {
    why << "dpukv agent: cannot read config " << path << "\n";
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
      why << path << ":" << n << ": expected 'name: value'\n";
      return false;
    }
    auto trim = [](std::string x) {
      x.erase(0, x.find_first_not_of(" \t\"'"));
      x.erase(x.find_last_not_of(" \t\"'\r") + 1);
      return x;
    };
    const std::string k = trim(line.substr(0, colon));
    std::string v = trim(line.substr(colon + 1));
    AgentSetting* s = st->find(k);
    if (s == nullptr) {
      why << path << ":" << n << ": unknown setting '" << k
          << "' (see examples/agent.yaml for every setting)\n";
      return false;
    }
    if (k == "local_disk" && v.rfind("file://", 0) == 0) v = v.substr(7);
    // Tenant rules come a line each: they add up (a later file's replace them).
    if (k == "tenant" && !s->value.empty() && s->origin.rfind(path + ":", 0) == 0)
      v = s->value + "\n" + v;
    s->value = v;
    s->origin = path + ":" + std::to_string(n);
  }
  return true;
}

void apply_environment(AgentSettings* st) {
  for (AgentSetting& s : st->all) {
    if (s.env == nullptr) continue;
    const char* v = std::getenv(s.env);
    if (v == nullptr || *v == '\0') continue;
    s.value = v;
    s.origin = std::string(s.env);
  }
}

// Parses every setting by its kind; prints each bad one. False if any was bad.
bool check_settings(const AgentSettings& st, std::ostream& why) {
  bool ok = true;
  for (const AgentSetting& s : st.all) {
    if (s.value.empty()) continue;
    std::string err;
    uint64_t u = 0;
    int port = 0;
    bool b = false;
    bool good = true;
    switch (s.kind) {
      case SettingKind::kText:
        break;
      case SettingKind::kGib:
        good = parse_gib_size(s.value, &u, &err);
        break;
      case SettingKind::kBytes:
        good = parse_byte_size(s.value, &u, &err);
        break;
      case SettingKind::kCount:
        good = parse_count(s.value, s.max, &u, &err) && u >= s.min;
        if (!good && s.min > 0)  // parse_count's words say "from 0"
          err = "'" + s.value + "' is not an integer from " + std::to_string(s.min) + " to " +
                std::to_string(s.max);
        break;
      case SettingKind::kPort:
        good = parse_port(s.value, &port, &err);
        break;
      case SettingKind::kBool:
        good = parse_bool(s.value, &b, &err);
        break;
      case SettingKind::kChoice: {
        const std::string c = std::string("|") + s.choices + "|";
        good = c.find("|" + s.value + "|") != std::string::npos;
        if (!good) err = "'" + s.value + "' is not one of " + s.choices;
        break;
      }
    }
    if (!good) {
      why << "dpukv agent: " << setting_origin(s) << ": " << err << "\n";
      ok = false;
    }
  }
  return ok;
}

// A redis:// URL with its password (if any) replaced by ***, for logs and errors.
std::string masked_redis_url(const std::string& url) {
  const size_t at = url.rfind('@');
  const size_t scheme = url.rfind("redis://", 0) == 0 ? 8 : 0;
  if (at == std::string::npos) return url;
  const size_t colon = url.find(':', scheme);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

namespace {

// cluster (redis://[USER[:PASSWORD]@]HOST:PORT), cluster_password_file,
// cluster_prefix, advertise.
bool cluster_settings(AgentSettings* st, AgentOptions* o, std::ostream& why) {
  std::string url = st->at("cluster").value;
  if (url.empty() && st->given("cluster")) {
    why << "dpukv agent: " << setting_origin(st->at("cluster"))
        << " is empty: give redis://HOST:PORT, or leave it out to run without a cluster\n";
    return false;
  }
  if (url.empty()) {
    if (st->at("remote_tier").value != "none") {
      why << "dpukv agent: " << setting_origin(st->at("remote_tier"))
          << " is set but cluster is not: the remote tier lives in the cluster's Redis "
             "(give --cluster redis://HOST:PORT too)\n";
      return false;
    }
    if (st->given("advertise")) {
      why << "dpukv agent: " << setting_origin(st->at("advertise"))
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
    why << "dpukv agent: " << setting_origin(st->at("cluster")) << ": '"
        << masked_redis_url(st->at("cluster").value)
        << "' is not redis://[USER[:PASSWORD]@]HOST:PORT with a port of 1-65535\n";
    return false;
  }
  // The password: from a file or the environment, which other users cannot read in
  // /proc/PID/cmdline as they can a flag.
  const AgentSetting& file = st->at("cluster_password_file");
  const char* env_password = std::getenv("DPUKV_CLUSTER_PASSWORD");
  if (!file.value.empty()) {
    std::ifstream f(file.value);
    if (!f || !std::getline(f, password) || password.empty()) {
      why << "dpukv agent: " << setting_origin(file) << ": cannot read a password from '"
          << file.value << "'" << (f ? " (the file is empty)" : "") << "\n";
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
    why << "dpukv agent: " << setting_origin(st->at("cluster_lookup_timeout_ms"))
        << ": must be at least 1 (ms)\n";
    return false;
  }
  c.prefix = st->at("cluster_prefix").value;
  c.remote_tier = st->at("remote_tier").value == "redis";
  c.replica_max_keys = as_u64(st, "directory_replica_keys");
  if (c.prefix.empty() || c.prefix.find_first_of(" \t\r\n") != std::string::npos) {
    why << "dpukv agent: " << setting_origin(st->at("cluster_prefix"))
        << ": must be a non-empty word\n";
    return false;
  }
  const std::string adv = st->at("advertise").value;
  if (!adv.empty()) {
    const std::string ifname = interface_of(adv);
    if (ifname.empty()) {
      why << "dpukv agent: " << setting_origin(st->at("advertise"))
          << ": no interface of this host "
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

}  // namespace

bool agent_options_from_settings(AgentSettings* st, AgentOptions* out, std::ostream& why) {
  AgentOptions& o = *out;
  o.socket_path = st->at("socket").value;
  // Checked before anything costly (the memory tier is pre-faulted at start).
  {
    const std::string path = o.socket_path.empty() ? default_socket_path() : o.socket_path;
    const size_t room = sizeof(sockaddr_un::sun_path) - 1;
    if (path.size() > room) {
      why << "dpukv agent: " << setting_origin(st->at("socket")) << ": '" << path << "' is "
          << path.size() << " bytes, too long for a UNIX socket (at most " << room << ")\n";
      return false;
    }
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    struct stat sb {};
    if (::stat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      why << "dpukv agent: " << setting_origin(st->at("socket")) << ": the directory '" << dir
          << "' of '" << path << "' does not exist\n";
      return false;
    }
  }
  if (as_u64(st, "max_requests") == 0) {
    why << "dpukv agent: " << setting_origin(st->at("max_requests")) << ": must be at least 1\n";
    return false;
  }
  o.cache.max_requests = static_cast<uint32_t>(as_u64(st, "max_requests"));
  const uint64_t max_chunk = as_u64(st, "max_chunk_size");
  if (max_chunk == 0) {
    why << "dpukv agent: " << setting_origin(st->at("max_chunk_size")) << ": must be above 0\n";
    return false;
  }
  // Embedded default: a quarter of the available RAM, at most 4 GiB.
  uint64_t mem = std::min<uint64_t>(available_ram() / 4, 4ull << 30);
  const char* mem_from = "a quarter of the available memory, at most 4 GiB";
  if (!st->at("memory_bytes").value.empty()) {
    mem = as_u64(st, "memory_bytes"), mem_from = "memory_bytes";
  } else if (!st->at("max_local_cpu_size").value.empty()) {
    mem = as_u64(st, "max_local_cpu_size"), mem_from = "max_local_cpu_size";
  }
  if (mem < max_chunk) {
    why << "dpukv agent: the memory tier (" << size_text(mem) << ", from " << mem_from
        << ") is smaller than max_chunk_size (" << size_text(max_chunk)
        << "): raise the one or lower the other\n";
    return false;
  }
  o.cache.memory_bytes = mem;
  o.cache.max_chunk_bytes = max_chunk;
  const std::string disk_dir = st->at("local_disk").value;
  const uint64_t disk = as_u64(st, "max_local_disk_size");
  if (disk_dir.empty() && st->given("max_local_disk_size")) {
    why << "dpukv agent: " << setting_origin(st->at("max_local_disk_size"))
        << " is set but local_disk is not: there is no disk tier to size (give "
           "--local-disk DIR too)\n";
    return false;
  }
  if (!disk_dir.empty() && disk < max_chunk) {
    why << "dpukv agent: local_disk needs max_local_disk_size of at least one chunk ("
        << size_text(max_chunk) << "); it is " << size_text(disk) << "\n";
    return false;
  }
  if (!st->at("nvme_tier").value.empty() && disk_dir.empty()) {
    why << "dpukv agent: --nvme-tier needs --local-disk (the tier's index log lives there)\n";
    return false;
  }
  const uint64_t max_chunks = as_u64(st, "max_chunks");
  o.cache.max_chunks =
      max_chunks
          ? static_cast<uint32_t>(max_chunks)
          : static_cast<uint32_t>(std::min<uint64_t>((mem + disk) / (16 << 10) + 1024, 16u << 20));
  o.cache.disk_dir = disk_dir;
  o.cache.disk_bytes = disk_dir.empty() ? 0 : disk;
  o.cache.nvme_address = st->at("nvme_tier").value;
  o.cache.nvme_nqn = st->at("nvme_tier_nqn").value;
  o.cache.write_through = as_bool(st, "write_through");
  o.max_clients = static_cast<uint32_t>(as_u64(st, "max_clients"));
  o.max_clients_per_uid = static_cast<uint32_t>(as_u64(st, "max_clients_per_uid"));
  (void)parse_tenant_fallback(st->at("tenant_by").value, &o.tenancy.fallback);
  o.tenancy.memory_quota = as_u64(st, "tenant_memory_quota");
  o.tenancy.disk_quota = as_u64(st, "tenant_disk_quota");
  o.tenancy.staging_quota = as_u64(st, "tenant_staging_quota");
  {
    std::istringstream rules(st->at("tenant").value);
    std::string line, err;
    while (std::getline(rules, line)) {
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      TenantRule r;
      if (!parse_tenant_rule(line, &r, &err)) {
        why << "dpukv agent: " << setting_origin(st->at("tenant")) << ": " << err << "\n";
        return false;
      }
      o.tenancy.rules.push_back(std::move(r));
    }
    const std::string& admins = st->at("tenant_admin_group").value;
    if (!admins.empty()) {
      gid_t g = 0;
      if (!group_id(admins, &g)) {
        why << "dpukv agent: " << setting_origin(st->at("tenant_admin_group")) << ": no group '"
            << admins << "'\n";
        return false;
      }
      o.tenancy.admin_gids.push_back(g);
    }
  }
  o.cache.dma.num_threads = std::max<uint32_t>(1, static_cast<uint32_t>(as_u64(st, "dma_threads")));
  o.cache.compress = as_bool(st, "compress");
  o.gpu.enabled = st->at("gpu").value != "off";
  o.gpu.driver_library = st->at("cuda_driver").value;
  const std::string& sums = st->at("gpu_checksum").value;
  o.gpu.checksum = sums == "gpu"    ? CudaEngineOptions::Checksum::kGpu
                   : sums == "host" ? CudaEngineOptions::Checksum::kHost
                                    : CudaEngineOptions::Checksum::kAuto;
  // The GPU copies' checksums need more than a core where one core's DRAM bandwidth
  // trails the GPU's link (6 GB/s against 55 on the H200 machine): at least
  // min(4, CPUs / 4) threads, more with --dma-threads.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  o.gpu.hash_threads = std::max<uint32_t>(o.cache.dma.num_threads,
                                          static_cast<uint32_t>(std::clamp(cpus / 4, 1L, 4L)));
  if (CacheEngine::slot_bytes(o.cache) > mem) {
    why << "dpukv agent: with compress, a chunk of max_chunk_size (" << size_text(max_chunk)
        << ") first takes a slot of the codec's worst case (" << CacheEngine::slot_bytes(o.cache)
        << " bytes), more than the memory tier (" << mem << " bytes, from " << mem_from
        << "): raise the memory tier or lower max_chunk_size\n";
    return false;
  }
  // The embedded default is a whole number of slots: no "holds less than asked"
  // warning for a size nobody asked for.
  if (st->at("memory_bytes").value.empty() && st->at("max_local_cpu_size").value.empty()) {
    const uint64_t slot = CacheEngine::slot_bytes(o.cache);
    mem = mem / slot * slot;
    o.cache.memory_bytes = mem;
  }
  o.cache.policy = st->at("eviction").value;
  o.cache.disk_admit_hits = static_cast<uint32_t>(as_u64(st, "disk_admit_hits"));
  o.cache.pin_timeout_ms = static_cast<uint32_t>(as_u64(st, "pin_timeout_ms"));
  std::string err;
  (void)parse_port(st->at("metrics_port").value, &o.metrics_port, &err);
  o.metrics_address = st->at("metrics_address").value;
  o.max_staging_bytes = st->at("max_staging_size").value.empty()
                            ? std::max<uint64_t>(available_ram() / 2, 1ull << 30)
                            : as_u64(st, "max_staging_size");
  // All clients together: as much as one may have by default (half the RAM), and
  // never less than one client's cap.
  o.max_staging_total_bytes = st->at("max_staging_total").value.empty()
                                  ? std::max<uint64_t>(available_ram() / 2, o.max_staging_bytes)
                                  : as_u64(st, "max_staging_total");

  return cluster_settings(st, &o, why);
}

}  // namespace dpukv
