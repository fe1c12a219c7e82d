// Who shares KV with whom: the agent puts every connection in a tenant from what
// the kernel says about the peer (its uid and groups, SO_PEERCRED and
// SO_PEERGROUPS) or from the socket it came through, never from anything the
// client sends. Chunks are kept under keys folded with the tenant's tag
// (protocol/tenant_key.h): a tenant finds, reads, removes, watches and pushes its
// own chunks only. Admins (root, the agent's own user, a configured group) may
// clear every tenant's chunks and watch every tenant's events.
//
// Rules, in the order given, name a tenant and who is in it:
//   NAME uid:1000 user:alice gid:2000 group:vllm socket:/run/dpukv/a.sock memory:2G disk:20G
//        staging:4G
// A peer on a tenant's own socket is in that tenant; a peer on the main socket is
// in the first rule that names its uid or one of its groups, else in the fallback
// (tenant_by): a tenant of its own per user (the default), per primary group, one
// tenant shared by everyone, or refused.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comch/connection.h"
#include "runtime/status.h"

namespace dpukv {

struct TenantRule {
  std::string name;
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  std::string socket;          // a socket of its own ("" if none)
  uint64_t memory_quota = 0;   // bytes of the memory tier; 0: the default
  uint64_t disk_quota = 0;     // bytes of the disk tier; 0: the default
  uint64_t staging_quota = 0;  // staging all its clients may export; 0: the default
};

enum class TenantFallback { kUser, kGroup, kShared, kRefuse };

struct TenancyOptions {
  std::vector<TenantRule> rules;
  TenantFallback fallback = TenantFallback::kUser;
  std::vector<gid_t> admin_gids;  // besides root and the agent's own uid
  uint64_t memory_quota = 0;      // each tenant's share of the memory tier (0: none)
  uint64_t disk_quota = 0;        // each tenant's share of the disk tier (0: none)
  uint64_t staging_quota = 0;     // staging each tenant's clients may export together (0: none)
};

// "NAME uid:N user:NAME gid:N group:NAME socket:PATH memory:SIZE disk:SIZE
// staging:SIZE" (any
// number of members, at least one; names resolved now). False and *err if bad.
bool parse_tenant_rule(const std::string& text, TenantRule* out, std::string* err);
// A user's or group's id by name, from the system's databases; false if none.
bool user_id(const std::string& name, uid_t* out);
bool group_id(const std::string& name, gid_t* out);
// "user", "group", "shared" or "refuse".
bool parse_tenant_fallback(const std::string& text, TenantFallback* out);
const char* tenant_fallback_name(TenantFallback f);

struct Tenant {
  std::string name;
  uint32_t tag = 0;                           // folded into its keys
  uint32_t index = 0;                         // dense, for figures
  uint64_t memory_quota = 0, disk_quota = 0;  // 0: none
  uint64_t staging_quota = 0;                 // host and GPU staging of all its clients
};

class Tenants {
 public:
  static constexpr uint32_t kMaxTenants = 4096;  // tenants made on the fly beyond the rules

  // INVALID_VALUE (*why) if two rules' names are the same or share a tag.
  static Status create(const TenancyOptions& o, std::unique_ptr<Tenants>* out, std::string* why);

  // The tenant of a peer that came through the tenant socket `socket` (an index
  // of sockets(), or -1 for the main socket); nullptr if it is refused (*why).
  const Tenant* resolve(const PeerCred& p, int socket, std::string* why);
  bool admin(const PeerCred& p) const;
  const Tenant* by_tag(uint32_t tag) const;
  // Every tenant made so far, by index.
  const std::vector<std::unique_ptr<Tenant>>& all() const { return tenants_; }
  // The rules' own sockets, in order: (path, tenant).
  const std::vector<std::pair<std::string, const Tenant*>>& sockets() const { return sockets_; }
  TenantFallback fallback() const { return opts_.fallback; }

 private:
  explicit Tenants(const TenancyOptions& o) : opts_(o) {}
  Tenant* add(const std::string& name, const TenantRule* rule, std::string* why);
  Tenant* named(const std::string& name, std::string* why);

  TenancyOptions opts_;
  uid_t self_uid_ = 0;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  std::vector<const Tenant*> rule_tenants_;  // rule i's tenant
  std::unordered_map<uint32_t, Tenant*> by_tag_;
  std::unordered_map<std::string, Tenant*> by_name_;
  std::unordered_map<uint32_t, Tenant*> by_uid_, by_gid_;  // fallback tenants made
  std::vector<std::pair<std::string, const Tenant*>> sockets_;
};

}  // namespace dpukv
