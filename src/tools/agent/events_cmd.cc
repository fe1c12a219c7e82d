#include "tools/agent/events_cmd.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"

namespace dpukv {

namespace {

std::atomic<bool> g_events_stop{false};

// every_tenant: an admin's feed, each event with its tenant's tag.
void print_event(const agent::ChunkEvent& e, bool json, bool every_tenant) {
  const ChunkKey& k = e.key;
  char tenant[32] = "";
  if (json) {
    if (every_tenant) std::snprintf(tenant, sizeof(tenant), ",\"tenant\":\"%08x\"", e.tenant);
    std::printf(
        "{\"event\":\"%s\",\"model\":\"%016llx\",\"prefix_hash\":\"%016llx\",\"layout\":\"%"
        "016llx\","
        "\"rank\":%u,\"world_size\":%u%s}\n",
        e.present ? "stored" : "removed", static_cast<unsigned long long>(k.model),
        static_cast<unsigned long long>(k.prefix_hash), static_cast<unsigned long long>(k.layout),
        k.rank, k.world_size, tenant);
  } else {
    if (every_tenant) std::snprintf(tenant, sizeof(tenant), " tenant %08x", e.tenant);
    std::printf("%-8s model %016llx prefix %016llx layout %016llx rank %u/%u%s\n",
                e.present ? "stored" : "removed", static_cast<unsigned long long>(k.model),
                static_cast<unsigned long long>(k.prefix_hash),
                static_cast<unsigned long long>(k.layout), k.rank, k.world_size, tenant);
  }
}

int run_events(const std::string& socket, const std::string& model, bool json, uint64_t count,
               bool every_tenant) {
  ClientOptions o;
  o.socket_path = socket;
  o.connect_timeout_ms = 1000;
  o.model = model.empty() ? 0 : model_id(model);
  std::unique_ptr<Client> c;
  if (Client::connect(o, &c).ok() && c->subscribe_events(every_tenant) == Code::kNotPermitted) {
    std::cerr << "dpukv events: only an admin may watch every tenant (root, the agent's user, or "
                 "a member of its tenant_admin_group)\n";
    return 1;
  }
  if (c == nullptr || !c->subscribe_events(every_tenant).ok()) {
    const std::string why = Client::last_connect_error();
    std::cerr << "dpukv events: "
              << (why.empty() ? "no agent answered" + (socket.empty() ? "" : " on " + socket) : why)
              << "\n";
    return 1;
  }
  if (json) {
    std::printf("{\"event\":\"subscribed\"}\n");
  } else {
    std::printf("subscribed: chunks stored and removed%s, as the agent reports them\n",
                model.empty() ? "" : (" (model " + model + ")").c_str());
  }
  std::fflush(stdout);
  signal(SIGINT, [](int) { g_events_stop = true; });
  signal(SIGTERM, [](int) { g_events_stop = true; });
  std::vector<agent::ChunkEvent> batch;
  uint64_t seen = 0;
  bool was_connected = true;
  while (!g_events_stop && (count == 0 || seen < count)) {
    bool lost = false;
    const Status st = c->take_events(&batch, &lost);
    if (!st.ok() && was_connected)
      std::fprintf(stderr, "dpukv events: the agent went away; waiting\n");
    was_connected = st.ok();
    if (lost) {
      // Some events were dropped (a slow reader, a reconnect): a router rebuilds
      // its view of where prefixes are from the lookups it makes.
      std::printf(json ? "{\"event\":\"lost\"}\n" : "LOST     some events were dropped: rebuild\n");
    }
    for (const agent::ChunkEvent& e : batch) {
      print_event(e, json, every_tenant);
      if (count != 0 && ++seen >= count) break;
    }
    std::fflush(stdout);
    // A feed is read by polling the client, which never blocks: 10 ms between
    // polls (the agent batches events every 5 ms).
    if (batch.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

}  // namespace

void add_events_command(CLI::App* app, int* exit_code) {
  auto socket = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto count = std::make_shared<uint64_t>(0);
  auto every_tenant = std::make_shared<bool>(false);
  CLI::App* cmd = app->add_subcommand(
      "events",
      "Print the agent's event feed (chunks stored, and removed from every tier) as it comes, "
      "until SIGINT: what a router outside the engine consumes");
  cmd->add_option("--socket", *socket, "Agent socket");
  cmd->add_option("--model", *model, "Only this model's chunks (its name, as clients give it)");
  cmd->add_flag("--json", *json, "One JSON object per line");
  cmd->add_flag("--all-tenants", *every_tenant,
                "Every tenant's chunks, each with its tenant's tag (an admin's: root, the agent's "
                "user, tenant_admin_group); default: your tenant's");
  cmd->add_option("--count", *count, "Exit after this many events (0: never)")
      // "-1" would wrap to "never" in an unsigned count: refused as it reads.
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.find('-') == std::string::npos ? std::string()
                                                    : "--count is a number of events, 0 or more";
          },
          "COUNT"));
  cmd->callback([=] { *exit_code = run_events(*socket, *model, *json, *count, *every_tenant); });
}

}  // namespace dpukv
