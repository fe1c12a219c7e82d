#include "rpc/params.h"

#include <algorithm>
#include <cerrno>

namespace dpukv::rpc {

RpcError invalid(const std::string& msg) {
  return RpcError{kInvalidParams, "Invalid parameters: " + msg};
}

Params::Params(const Json& p, const std::vector<const char*>& known) : p_(p) {
  if (!p.is_object()) {
    err_ = "params must be an object";
    return;
  }
  for (auto it = p.begin(); it != p.end(); ++it)
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return it.key() == k; }) ==
        known.end()) {
      err_ = "unknown parameter '" + it.key() + "'";
      return;
    }
}

std::string Params::str(const char* k, const std::string& dflt, bool required) {
  if (!err_.empty()) return dflt;
  if (!p_.contains(k)) {
    if (required) err_ = std::string("missing '") + k + "'";
    return dflt;
  }
  const std::string key = k;
  if (p_[k].is_number_unsigned() && (key == "trsvcid" || key == "serial_number"))
    return p_[k].dump();
  if (!p_[k].is_string()) {
    err_ = std::string("'") + k + "' must be a string";
    return dflt;
  }
  return p_[k].get<std::string>();
}

uint64_t Params::num(const char* k, uint64_t dflt, bool required, uint64_t lo, uint64_t hi) {
  if (!err_.empty()) return dflt;
  if (!p_.contains(k)) {
    if (required) err_ = std::string("missing '") + k + "'";
    return dflt;
  }
  if (!p_[k].is_number_unsigned() && !(p_[k].is_number_integer() && p_[k].get<int64_t>() >= 0)) {
    err_ = std::string("'") + k + "' must be a non-negative integer";
    return dflt;
  }
  const uint64_t v = p_[k].get<uint64_t>();
  if (v < lo || v > hi) {
    err_ = std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]";
    return dflt;
  }
  return v;
}

bool Params::boolean(const char* k, bool dflt) {
  if (!err_.empty() || !p_.contains(k)) return dflt;
  if (!p_[k].is_boolean()) {
    err_ = std::string("'") + k + "' must be true or false";
    return dflt;
  }
  return p_[k].get<bool>();
}

const Json* Params::object(const char* k, bool required) {
  if (!err_.empty()) return nullptr;
  if (!p_.contains(k)) {
    if (required) err_ = std::string("missing '") + k + "'";
    return nullptr;
  }
  if (!p_[k].is_object()) {
    err_ = std::string("'") + k + "' must be an object";
    return nullptr;
  }
  return &p_[k];
}

RpcError from_status(Status st, const std::string& what) {
  switch (st.code()) {
    case Code::kSuccess:
      return {};
    case Code::kNotFound:
      return RpcError{-ENODEV, what + ": not found"};
    case Code::kBadState:
      return RpcError{-EEXIST, what + ": already exists or in use"};
    case Code::kInvalidValue:
      return invalid(what);
    case Code::kFull:
      return RpcError{-ENOSPC, what + ": no room"};
    case Code::kNoMemory:
      return RpcError{-ENOMEM, what + ": out of memory"};
    default:
      return RpcError{-EIO, what + ": " + std::string(st.name())};
  }
}

}  // namespace dpukv::rpc
