#include "tools/nvme/rpc_cmd.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "rpc/jsonrpc_server.h"

namespace dpukv {
namespace {

using Json = nlohmann::json;

// key=value: the value is JSON if it parses (numbers, true/false, objects),
// otherwise a string; dotted keys build nested objects (listen_address.traddr=...).
bool parse_params(const std::vector<std::string>& args, Json* out, std::string* err) {
  *out = Json::object();
  if (args.size() == 1 && !args[0].empty() && args[0][0] == '{') {
    *out = Json::parse(args[0], nullptr, false);
    if (out->is_discarded() || !out->is_object()) {
      *err = "params: not a JSON object";
      return false;
    }
    return true;
  }
  for (const auto& a : args) {
    size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0) {
      *err = "expected key=value, got '" + a + "'";
      return false;
    }
    std::string key = a.substr(0, eq), val = a.substr(eq + 1);
    Json v = Json::parse(val, nullptr, false);
    if (v.is_discarded()) v = val;
    Json* at = out;
    for (size_t dot; (dot = key.find('.')) != std::string::npos; key = key.substr(dot + 1)) {
      Json& next = (*at)[key.substr(0, dot)];
      if (!next.is_object()) next = Json::object();
      at = &next;
    }
    (*at)[key] = v;
  }
  return true;
}

int run_rpc(const std::string& socket_path, const std::string& method,
            const std::vector<std::string>& args, int timeout_s) {
  Json params;
  std::string err;
  if (!parse_params(args, &params, &err)) {
    std::cerr << "dpukv rpc: " << err << "\n";
    return 2;
  }
  // -t bounds the whole call: connect, send and the answer share one deadline.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  auto left_ms = [&] {
    const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::max<int64_t>(0, d.count()));
  };
  auto timed_out = [&](const char* what) {
    std::cerr << "dpukv rpc: " << what << " within " << timeout_s << " s (-t)\n";
    return 1;
  };
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) {
    std::cerr << "dpukv rpc: socket path longer than " << sizeof addr.sun_path - 1
              << " bytes: " << socket_path << "\n";
    return 2;
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  for (;;) {  // a UNIX socket whose backlog is full says EAGAIN: retry until the deadline
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    if (fd >= 0 && errno == EAGAIN && left_ms() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fd >= 0 && errno == EAGAIN) return timed_out("could not connect");
    std::cerr << "dpukv rpc: cannot connect to " << socket_path << ": " << strerror(errno)
              << " (is `dpukv nvme` running?)\n";
    return 1;
  }
  Json req{{"jsonrpc", "2.0"}, {"id", 1}, {"method", method}};
  if (!params.empty()) req["params"] = params;
  std::string out = req.dump();
  for (size_t off = 0; off < out.size();) {
    const ssize_t k = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EINTR) {
      std::cerr << "dpukv rpc: send: " << strerror(errno) << "\n";
      return 1;
    }
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, left_ms()) != 1) return timed_out("could not send the request");
  }
  std::string in;
  char buf[65536];
  for (;;) {
    size_t end = rpc::json_value_end(in);
    if (end != 0 && end != std::string::npos) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left_ms()) != 1) return timed_out("no answer");
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      std::cerr << "dpukv rpc: connection closed\n";
      return 1;
    }
    in.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  Json resp = Json::parse(in.substr(0, rpc::json_value_end(in)), nullptr, false);
  if (resp.is_discarded() || !resp.is_object()) {
    std::cerr << "dpukv rpc: malformed response\n";
    return 1;
  }
  if (resp.contains("error")) {
    std::cerr << "dpukv rpc: " << method << " failed (" << resp["error"].value("code", 0)
              << "): " << resp["error"].value("message", std::string()) << "\n";
    return 1;
  }
  std::cout << resp["result"].dump(2) << "\n";
  return 0;
}

}  // namespace

void add_rpc_command(CLI::App* app, int* exit_code) {
  static std::string socket_path = "/var/tmp/dpukv-nvme.sock", method;
  static std::vector<std::string> args;
  static int timeout = 60;
  CLI::App* r = app->add_subcommand(
      "rpc", "Call a JSON-RPC method of `dpukv nvme` (params: JSON or key=value)");
  r->add_option("-s,--server", socket_path, "JSON-RPC socket")->capture_default_str();
  r->add_option("-t,--timeout", timeout, "Seconds to wait for the answer")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  r->add_option("method", method, "Method name (rpc_get_methods lists them)")->required();
  r->add_option("params", args, "One JSON object, or key=value pairs (a.b=v nests)");
  r->callback([exit_code] { *exit_code = run_rpc(socket_path, method, args, timeout); });
}

}  // namespace dpukv
