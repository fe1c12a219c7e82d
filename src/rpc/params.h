// Parameters of a JSON-RPC call, checked before use: every field for presence,
// type and range, and unknown fields refused (a typo should not pass silently).
// The first problem is kept and becomes an "Invalid parameters" error.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "rpc/jsonrpc_server.h"
#include "runtime/status.h"

namespace dpukv::rpc {

RpcError invalid(const std::string& msg);
// A Status as a JSON-RPC error (negative errno codes, as SPDK answers), naming what.
RpcError from_status(Status st, const std::string& what);

class Params {
 public:
  Params(const Json& p, std::initializer_list<const char*> known)
      : Params(p, std::vector<const char*>(known)) {}
  Params(const Json& p, const std::vector<const char*>& known);
  bool has(const char* k) const { return err_.empty() && p_.contains(k); }
  // A number is taken as its decimal text only for trsvcid and serial_number
  // (numeric text by nature); every other string field must be a string.
  std::string str(const char* k, const std::string& dflt = "", bool required = false);
  uint64_t num(const char* k, uint64_t dflt, bool required, uint64_t lo, uint64_t hi);
  bool boolean(const char* k, bool dflt);
  const Json* object(const char* k, bool required);
  bool ok() const { return err_.empty(); }
  RpcError error() const { return invalid(err_); }
  const std::string& problem() const { return err_; }
  void fail(const std::string& e) {
    if (err_.empty()) err_ = e;
  }

 private:
  const Json& p_;
  std::string err_;
};

}  // namespace dpukv::rpc
