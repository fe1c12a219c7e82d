// A JSON-RPC 2.0 server on a UNIX socket, framed as SPDK's is: a stream of JSON
// objects (no length prefix, no newline needed), one response object per request
// with an id, none for notifications. Methods are registered by name; a method
// list given at start limits what is served (--rpcs-allowed); methods not marked
// for the startup state are refused until the application says it is running.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace dpukv::rpc {

using Json = nlohmann::json;

// JSON-RPC 2.0 error codes, plus the one SPDK uses for a method called in the
// wrong state.
enum ErrorCode : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
  kInvalidState = -1,
};

struct RpcError {
  int code = 0;  // 0: no error
  std::string message;
  bool ok() const { return code == 0; }
};

// Handlers fill *result (any JSON value) or return an error. They run on the
// server thread, one request at a time.
using Handler = std::function<RpcError(const Json& params, Json* result)>;

class JsonRpcServer {
 public:
  static constexpr size_t kMaxRequest = 1u << 20;
  static constexpr size_t kMaxOutput = 4u << 20;  // answers queued for one client
  static constexpr int kBudget = 16;              // requests answered per client per round

  JsonRpcServer() = default;
  ~JsonRpcServer();
  JsonRpcServer(const JsonRpcServer&) = delete;
  JsonRpcServer& operator=(const JsonRpcServer&) = delete;

  // startup: may be called before the application is running (--wait-for-rpc).
  void add(const std::string& method, Handler h, bool startup = false);
  // Serves on path (mode 0600). allowed: method names served; empty: all.
  Status start(const std::string& path, const std::vector<std::string>& allowed);
  void stop();
  void set_running(bool running) { running_.store(running); }
  bool running() const { return running_.load(); }
  std::vector<std::string> methods(bool current_state_only) const;

  // Handles one request object (the whole dispatch, for tests and fuzzing):
  // returns the response, or null for a notification.
  Json dispatch(const Json& request);

 private:
  struct Method {
    Handler handler;
    bool startup;
  };
  struct Conn {
    int fd;
    std::string in, out;
    bool closing;  // close once out is sent
  };
  void run();
  // Each returns false when the connection is to be closed.
  bool serve(Conn& c);
  bool answer(Conn& c);
  bool flush(Conn& c);
  static bool backlog(const Conn& c);  // complete requests wait and may be answered

  std::map<std::string, Method> methods_;
  std::vector<std::string> allowed_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  int listen_fd_ = -1, wake_fd_ = -1;
  std::string path_;
  std::thread thread_;
};

// The end of the first complete JSON value in s (after leading whitespace), or
// 0 if it is not complete yet; npos if s cannot start a JSON object or array.
size_t json_value_end(const std::string& s);

}  // namespace dpukv::rpc
