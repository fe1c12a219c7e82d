#include "tools/nvme/nvme_cmd.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "nvme/tcp_host.h"
#include "nvme/vfio_user_driver.h"
#include "nvmf/bdev/bdev.h"
#include "nvmf/bdev/bdev_registry.h"
#include "nvmf/nvmf_app.h"
#include "nvmf/nvmf_target.h"
#include "nvmf/vfio_user/emulation_manager.h"
#include "runtime/arg_parse.h"
#include "runtime/host_port.h"
#include "runtime/log.h"
#include "tools/common/bench_common.h"
#include "tools/nvme/perf.h"

namespace dpukv {
namespace {

using bench::Json;
using namespace nvme;

struct TargetConfig {
  std::string socket;
  std::string bdev = "malloc";
  std::string size = "1G";
  std::string file;
  uint32_t block_size = 4096;
  uint32_t namespaces = 1;
  int cpu = -1;
  std::string serial = "DPUKV00000001";
  std::string transport = "vfio-user";
  std::string listen = "127.0.0.1:4420";
  std::string nqn = "nqn.2026-11.io.dpukv:cnode1";
  std::vector<std::string> hosts;  // empty: any host
  uint32_t icreq_timeout_ms = TcpTransportOptions{}.icreq_timeout_ms;
  uint32_t connect_timeout_ms = TcpTransportOptions{}.connect_timeout_ms;
  uint32_t pdu_timeout_ms = TcpTransportOptions{}.pdu_timeout_ms;
  uint32_t no_kato_timeout_ms = TcpTransportOptions{}.no_kato_timeout_ms;
  uint32_t max_connections = TcpTransportOptions{}.max_connections_per_listener;
  std::string port_file;
};

// Through the same registry as the bdev_<kind>_create methods: the parameters
// mean the same on both paths.
Status make_bdev(const TargetConfig& c, uint32_t index, std::shared_ptr<Bdev>* out,
                 std::string* problem) {
  uint64_t bytes = 0;
  if (Status st = bench::parse_size(c.size, &bytes); !st.ok()) return st;
  const BdevKind* kind = find_bdev_kind(c.bdev);
  if (kind == nullptr) {
    *problem = "unknown bdev kind (one of " + bdev_kind_names() + ")";
    return Code::kInvalidValue;
  }
  nlohmann::json params{{"num_blocks", bytes / c.block_size}, {"block_size", c.block_size}};
  if (c.bdev == "file") {
    params.erase("num_blocks");
    params["filename"] = c.namespaces > 1 ? c.file + "." + std::to_string(index) : c.file;
    params["size"] = bytes;
  }
  rpc::Params p(params, kind->params);
  BdevLimits limits;
  limits.max_memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2;
  std::unique_ptr<Bdev> b;
  Status st = kind->create(p, limits, c.bdev + std::to_string(index), &b);
  if (!p.ok()) *problem = p.problem();
  if (st.ok()) *out = std::move(b);
  return st;
}

volatile sig_atomic_t g_stop = 0;

void wait_for_signal() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  while (!g_stop) pause();
}

int run_tcp_target(const TargetConfig& c, std::vector<std::shared_ptr<Bdev>> bdevs) {
  std::string addr;
  uint16_t port = 0;
  if (!parse_host_port(c.listen, &addr, &port)) {
    std::cerr << "dpukv nvme target: --listen wants ADDR:PORT\n";
    return 2;
  }
  TcpTransportOptions to;
  to.cpu = c.cpu;
  to.icreq_timeout_ms = c.icreq_timeout_ms;
  to.connect_timeout_ms = c.connect_timeout_ms;
  to.pdu_timeout_ms = c.pdu_timeout_ms;
  to.no_kato_timeout_ms = c.no_kato_timeout_ms;
  to.max_connections_per_listener = c.max_connections;
  std::unique_ptr<NvmfTarget> t;
  if (Status st = NvmfTarget::create(to, &t); !st.ok()) return 1;
  SubsystemConfig sc;
  sc.nqn = c.nqn;
  sc.serial = c.serial;
  sc.allow_any_host = c.hosts.empty();
  sc.hosts = c.hosts;
  if (Status st = t->create_subsystem(sc); !st.ok()) {
    std::cerr << "dpukv nvme target: bad subsystem NQN or serial: " << st.name() << "\n";
    return 2;
  }
  for (auto& b : bdevs) {
    uint32_t nsid = 0;
    if (!t->add_namespace(c.nqn, b, 0, &nsid).ok()) return 1;
  }
  uint16_t bound = 0;
  if (Status st = t->add_listener(c.nqn, addr, port, &bound); !st.ok()) {
    std::cerr << "dpukv nvme target: cannot listen on " << c.listen << ": " << st.name() << "\n";
    return 1;
  }
  if (!c.port_file.empty()) {
    FILE* f = std::fopen((c.port_file + ".tmp").c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "%u\n", bound);
    std::fclose(f);
    std::rename((c.port_file + ".tmp").c_str(), c.port_file.c_str());
  }
  std::cerr << "dpukv nvme target: subsystem " << c.nqn << " listening on tcp " << addr << ":"
            << bound << " (" << c.namespaces << " x " << c.bdev << " " << c.size << ", "
            << c.block_size << "-byte blocks, "
            << (c.hosts.empty() ? "any host" : std::to_string(c.hosts.size()) + " allowed hosts")
            << ")\n";
  wait_for_signal();
  TargetStats st = t->stats();
  std::cerr << "dpukv nvme target: " << st.connections << " connections, " << st.commands
            << " commands, " << st.errors << " errors, " << st.term_reqs_sent << " terminations, "
            << st.connect_rejects << " refused connects, " << st.keep_alive_expiries
            << " keep-alive expiries\n";
  return 0;
}

int run_vfio_user_target(const TargetConfig& c, std::vector<std::shared_ptr<Bdev>> bdevs) {
  FunctionSpec spec;
  spec.socket_path = c.socket;
  spec.config.controller.serial = c.serial;
  spec.namespaces = std::move(bdevs);
  ManagerOptions mo;
  mo.cpu = c.cpu;
  std::unique_ptr<EmulationManager> mgr;
  if (Status st = EmulationManager::create(mo, &mgr); !st.ok()) return 1;
  std::string id;
  if (Status st = mgr->create_function(spec, &id); !st.ok()) {
    std::cerr << "dpukv nvme target: cannot create the function on " << c.socket << ": "
              << st.name() << "\n";
    return 1;
  }
  std::cerr << "dpukv nvme target: function " << id << " listening on " << c.socket << " ("
            << c.namespaces << " x " << c.bdev << " " << c.size << ", " << c.block_size
            << "-byte blocks)\n";
  wait_for_signal();
  for (const FunctionInfo& f : mgr->list_functions())
    std::cerr << "dpukv nvme target: " << f.id << ": " << f.stats.io_commands << " I/O commands, "
              << f.stats.admin_commands << " admin, " << f.stats.errors << " errors, "
              << f.stats.fatal << " fatal\n";
  return 0;
}

// The transports `nvme target` serves a namespace set on, by --transport name (the
// first is the default): what each needs on the command line, and how it serves.
struct TargetTransport {
  const char* name;
  const char* summary;
  const char* (*check)(const TargetConfig& c);  // what c lacks for it, or null
  int (*serve)(const TargetConfig& c, std::vector<std::shared_ptr<Bdev>> bdevs);
};
constexpr TargetTransport kTargetTransports[] = {
    {"vfio-user", "an emulated PCIe function",
     [](const TargetConfig& c) -> const char* {
       return c.socket.empty() ? "--socket is required for vfio-user" : nullptr;
     },
     &run_vfio_user_target},
    {"tcp", "NVMe/TCP", [](const TargetConfig&) -> const char* { return nullptr; },
     &run_tcp_target},
};

const TargetTransport* find_target_transport(const std::string& name) {
  for (const TargetTransport& t : kTargetTransports)
    if (name == t.name) return &t;
  return nullptr;
}

int run_target(const TargetConfig& c) {
  const TargetTransport* transport = find_target_transport(c.transport);
  if (transport == nullptr) {
    std::cerr << "dpukv nvme target: unknown transport " << c.transport << "\n";
    return 2;
  }
  if (const char* problem = transport->check(c); problem != nullptr) {
    std::cerr << "dpukv nvme target: " << problem << "\n";
    return 2;
  }
  if (!valid_block_size(c.block_size)) {
    std::cerr << "dpukv nvme target: --block-size must be 512 or 4096\n";
    return 2;
  }
  if (c.bdev == "file" && c.file.empty()) {
    std::cerr << "dpukv nvme target: --bdev file needs --file PATH\n";
    return 2;
  }
  if (uint64_t bytes = 0;
      !bench::parse_size(c.size, &bytes).ok() || bytes == 0 || bytes % c.block_size != 0) {
    std::cerr << "dpukv nvme target: --size '" << c.size
              << "' is not a size of whole blocks (4K, 64M, 1G, ...; block size " << c.block_size
              << ")\n";
    return 2;
  }
  std::vector<std::shared_ptr<Bdev>> bdevs;
  for (uint32_t i = 0; i < c.namespaces; ++i) {
    std::shared_ptr<Bdev> b;
    std::string problem;
    if (Status st = make_bdev(c, i, &b, &problem); !st.ok()) {
      std::cerr << "dpukv nvme target: cannot create " << c.bdev << " bdev of " << c.size << ": "
                << (problem.empty() ? std::string(st.name()) : problem) << "\n";
      return 1;
    }
    bdevs.push_back(std::move(b));
  }
  return transport->serve(c, std::move(bdevs));
}

std::string ascii(const uint8_t* p, size_t n) {
  std::string s(reinterpret_cast<const char*>(p), n);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

int run_identify(const std::string& socket, bool json) {
  DriverOptions o;
  o.queue_entries = 16;
  std::unique_ptr<VfioUserDriver> d;
  if (Status st = VfioUserDriver::attach(socket, o, &d); !st.ok()) {
    std::cerr << "dpukv nvme identify: cannot attach to " << socket << ": " << st.name() << "\n";
    return 1;
  }
  uint8_t id[kIdentifySize];
  uint16_t status = 0;
  if (!d->identify(kCnsController, 0, id, &status).ok() || status != kSuccess) {
    std::cerr << "dpukv nvme identify: Identify Controller failed (status 0x" << std::hex << status
              << ")\n";
    return 1;
  }
  uint16_t vid, cntlid;
  uint32_t ver, nn;
  std::memcpy(&vid, id, 2);
  std::memcpy(&cntlid, id + 78, 2);
  std::memcpy(&ver, id + 80, 4);
  std::memcpy(&nn, id + 516, 4);
  Json j;
  j["vendor_id"] = vid;
  j["serial"] = ascii(id + 4, 20);
  j["model"] = ascii(id + 24, 40);
  j["firmware"] = ascii(id + 64, 8);
  j["controller_id"] = cntlid;
  j["version"] = std::to_string(ver >> 16) + "." + std::to_string((ver >> 8) & 0xff);
  j["max_transfer_bytes"] = d->max_transfer();
  j["max_namespaces"] = nn;
  j["subsystem_nqn"] = ascii(id + 768, 256);
  j["io_queues"] = d->io_queue_count();
  Json nss = Json::array();
  for (uint32_t nsid : d->namespaces())
    nss.push_back(Json{{"nsid", nsid},
                       {"blocks", d->num_blocks(nsid)},
                       {"block_size", d->block_size(nsid)},
                       {"bytes", d->num_blocks(nsid) * d->block_size(nsid)}});
  j["namespaces"] = nss;
  if (json) {
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf("NVMe controller at %s\n", socket.c_str());
  std::printf(
      "  vendor id      0x%04x\n  serial         %s\n  model          %s\n  firmware       %s\n",
      vid, j["serial"].get<std::string>().c_str(), j["model"].get<std::string>().c_str(),
      j["firmware"].get<std::string>().c_str());
  std::printf(
      "  version        %s\n  controller id  %u\n  max transfer   %u bytes\n  subsystem nqn  %s\n",
      j["version"].get<std::string>().c_str(), cntlid, d->max_transfer(),
      j["subsystem_nqn"].get<std::string>().c_str());
  for (uint32_t nsid : d->namespaces())
    std::printf("  namespace %u: %llu blocks of %u bytes (%.2f GiB)\n", nsid,
                static_cast<unsigned long long>(d->num_blocks(nsid)), d->block_size(nsid),
                static_cast<double>(d->num_blocks(nsid) * d->block_size(nsid)) / (1u << 30));
  return 0;
}

// `nvme discover` as nvme-cli prints it: the discovery log of a target.
int run_discover(const std::string& where, const std::string& hostnqn, bool json) {
  TcpHostOptions o;
  if (!parse_host_port(where, &o.addr, &o.port, 4420)) {
    std::cerr << "dpukv nvme discover: --connect: '" << where << "' is not ADDR[:PORT]\n";
    return 2;
  }
  if (!hostnqn.empty()) o.hostnqn = hostnqn;
  std::string ip, why;
  if (!resolve_ipv4(o.addr, &ip, &why)) {
    std::cerr << "dpukv nvme discover: --connect: cannot resolve '" << o.addr << "': " << why
              << "\n";
    return 2;
  }
  uint64_t genctr = 0;
  std::vector<DiscoveryEntry> entries;
  if (Status st = NvmeTcpHost::discover(o, &genctr, &entries); !st.ok()) {
    const char* what = st.code() == Code::kNotPermitted ? " (the Connect was refused)"
                       : st.code() == Code::kTimeout
                           ? " (no answer in time: is an NVMe/TCP target listening there?)"
                       : st.code() == Code::kFull
                           ? " (the target took the connection and closed it before answering: it "
                             "is at its connection limit; try again later, or raise the target's "
                             "--max-connections)"
                       : st.code() == Code::kConnectionReset
                           ? " (the connection was refused or closed: no target there?)"
                       : st.code() == Code::kCorrupted ? " (not an NVMe/TCP target's answer)"
                                                       : "";
    std::cerr << "dpukv nvme discover: " << where << " (" << ip << ":" << o.port
              << "): " << st.name() << what << "\n";
    return 1;
  }
  auto subtype = [](uint8_t t) {
    return t == 2 ? "nvme subsystem" : t == 3 ? "current discovery subsystem" : "discovery";
  };
  if (json) {
    Json recs = Json::array();
    for (const auto& e : entries)
      recs.push_back(Json{{"trtype", e.trtype == 3 ? "tcp" : std::to_string(e.trtype)},
                          {"adrfam", e.adrfam == 1 ? "ipv4" : std::to_string(e.adrfam)},
                          {"subtype", subtype(e.subtype)},
                          {"portid", e.portid},
                          {"trsvcid", e.trsvcid},
                          {"subnqn", e.subnqn},
                          {"traddr", e.traddr}});
    std::cout << Json{{"genctr", genctr}, {"records", recs}}.dump() << "\n";
    return 0;
  }
  std::printf("Discovery Log Number of Records %zu, Generation counter %llu\n", entries.size(),
              static_cast<unsigned long long>(genctr));
  for (size_t i = 0; i < entries.size(); ++i) {
    const DiscoveryEntry& e = entries[i];
    std::printf("=====Discovery Log Entry %zu======\n", i);
    std::printf("trtype:  %s\nadrfam:  %s\nsubtype: %s\nportid:  %u\ntrsvcid: %s\n",
                e.trtype == 3 ? "tcp" : "other", e.adrfam == 1 ? "ipv4" : "other",
                subtype(e.subtype), e.portid, e.trsvcid.c_str());
    std::printf("subnqn:  %s\ntraddr:  %s\n", e.subnqn.c_str(), e.traddr.c_str());
  }
  return 0;
}

int run_app(const AppOptions& o) {
  std::unique_ptr<NvmfApp> app;
  if (Status st = NvmfApp::create(o, &app); !st.ok()) {
    std::cerr << "dpukv nvme: cannot start (" << st.name() << "); see the log above\n";
    return 1;
  }
  std::cerr << "dpukv nvme: JSON-RPC on " << o.rpc_socket
            << (o.wait_for_rpc ? " (waiting for framework_start_init)" : "") << "\n";
  wait_for_signal();
  return 0;
}

}  // namespace

void add_nvme_commands(CLI::App* app, int* exit_code) {
  CLI::App* nvme = app->add_subcommand(
      "nvme",
      "NVMe target: with no subcommand, the NVMe-oF target application configured over JSON-RPC "
      "(bdevs, TCP and vfio-user transports, subsystems); target, identify, perf");
  nvme->require_subcommand(0, 1);
  static AppOptions ao;
  static std::string rpcs_allowed, cpu_mask;
  nvme->add_option("-r,--rpc-socket", ao.rpc_socket, "JSON-RPC UNIX socket")->capture_default_str();
  nvme->add_option("-c,--config", ao.config, "JSON config (SPDK format) replayed at start");
  nvme->add_flag("--wait-for-rpc", ao.wait_for_rpc,
                 "Serve only startup RPCs until framework_start_init");
  nvme->add_option("--rpcs-allowed", rpcs_allowed, "Comma-separated methods served (default: all)");
  nvme->add_option("-m,--cpu-mask", cpu_mask,
                   "CPUs as SPDK's -m: a hex mask (0x2) or a list ([1,3]); the poll group "
                   "runs pinned to the lowest");
  nvme->callback([nvme, exit_code] {
    if (!nvme->get_subcommands().empty()) return;
    if (!cpu_mask.empty()) {
      std::vector<int> cpus;
      std::string err;
      if (!parse_cpu_mask(cpu_mask, &cpus, &err)) {
        std::cerr << "dpukv nvme: -m: " << err << "\n";
        *exit_code = 2;
        return;
      }
      // One poll group serves every connection and function (SPDK would start a
      // reactor per CPU): it takes the lowest CPU, as SPDK's main reactor does.
      ao.cpu = cpus.front();
      if (cpus.size() > 1)
        std::cerr << "dpukv nvme: one poll group: pinned to CPU " << ao.cpu << " of the mask\n";
    }
    for (size_t p = 0; p < rpcs_allowed.size();) {
      size_t q = rpcs_allowed.find(',', p);
      if (q == std::string::npos) q = rpcs_allowed.size();
      if (q > p) ao.rpcs_allowed.push_back(rpcs_allowed.substr(p, q - p));
      p = q + 1;
    }
    *exit_code = run_app(ao);
  });

  static TargetConfig tc;
  CLI::App* t = nvme->add_subcommand(
      "target",
      "Serve one namespace set: an emulated PCIe function (vfio-user) or an NVMe/TCP subsystem");
  std::vector<std::string> transports;
  std::string transport_help;
  for (const TargetTransport& tt : kTargetTransports) {
    transports.emplace_back(tt.name);
    transport_help +=
        (transport_help.empty() ? "" : " or ") + std::string(tt.name) + " (" + tt.summary + ")";
  }
  t->add_option("--transport", tc.transport, transport_help)
      ->check(CLI::IsMember(transports))
      ->capture_default_str();
  t->add_option("--socket", tc.socket, "vfio-user socket path");
  t->add_option("--listen", tc.listen, "tcp: ADDR:PORT to listen on (port 0: any)")
      ->capture_default_str();
  t->add_option("--nqn", tc.nqn, "tcp: subsystem NQN")->capture_default_str();
  t->add_option("--allow-host", tc.hosts,
                "tcp: host NQN allowed to connect (repeat; none: any host)");
  t->add_option("--port-file", tc.port_file,
                "tcp: write the bound port to this file when listening");
  t->add_option("--icreq-timeout-ms", tc.icreq_timeout_ms,
                "tcp: close a connection that sends no ICReq within this")
      ->check(CLI::Range(1u, 3600u * 1000))
      ->capture_default_str();
  t->add_option("--connect-timeout-ms", tc.connect_timeout_ms,
                "tcp: close a connection that sends no Fabrics Connect within this after its ICReq")
      ->check(CLI::Range(1u, 3600u * 1000))
      ->capture_default_str();
  t->add_option(
       "--pdu-timeout-ms", tc.pdu_timeout_ms,
       "tcp: close a connection whose PDU, its header received, is not complete within this")
      ->check(CLI::Range(1u, 3600u * 1000))
      ->capture_default_str();
  t->add_option("--no-kato-timeout-ms", tc.no_kato_timeout_ms,
                "tcp: end an association with KATO 0 after this long without a command")
      ->check(CLI::Range(1u, 24u * 3600 * 1000))
      ->capture_default_str();
  t->add_option("--max-connections", tc.max_connections,
                "tcp: connections the listener keeps at once (more are closed at once)")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  std::vector<std::string> kinds;
  for (const BdevKind& k : bdev_kinds()) kinds.emplace_back(k.kind);
  t->add_option("--bdev", tc.bdev, "Namespace medium: " + bdev_kind_names())
      ->check(CLI::IsMember(kinds))
      ->capture_default_str();
  t->add_option("--size", tc.size, "Namespace size (4K, 1G, ...)")->capture_default_str();
  t->add_option("--file", tc.file, "Backing file for --bdev file");
  t->add_option("--block-size", tc.block_size, "LBA size: 512 or 4096")->capture_default_str();
  t->add_option("--namespaces", tc.namespaces, "Namespaces, each its own device")
      ->check(CLI::Range(1u, ControllerCore::kMaxNamespaces))
      ->capture_default_str();
  t->add_option("--serial", tc.serial, "Controller serial number")->capture_default_str();
  t->add_option("--cpu", tc.cpu, "Pin the poller thread to this CPU (-1: no pinning)")
      ->capture_default_str();
  t->callback([exit_code] { *exit_code = run_target(tc); });

  static std::string id_socket;
  static bool id_json = false;
  CLI::App* i =
      nvme->add_subcommand("identify", "Print what the controller's Identify commands return");
  i->add_option("--socket", id_socket, "vfio-user socket path")->required();
  i->add_flag("--json", id_json, "One JSON object");
  i->callback([exit_code] { *exit_code = run_identify(id_socket, id_json); });

  static std::string disc_where = "127.0.0.1:4420", disc_host;
  static bool disc_json = false;
  CLI::App* dc = nvme->add_subcommand(
      "discover", "Read an NVMe/TCP target's discovery log (the subsystems a host may connect to)");
  dc->add_option("--connect", disc_where, "The target's ADDR:PORT")->capture_default_str();
  dc->add_option("--hostnqn", disc_host, "Host NQN to discover as");
  dc->add_flag("--json", disc_json, "One JSON object");
  dc->callback([exit_code] { *exit_code = run_discover(disc_where, disc_host, disc_json); });

  add_nvme_perf_command(nvme, exit_code);
}

}  // namespace dpukv
