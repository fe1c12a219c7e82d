#include "agent/tenants.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "protocol/tenant_key.h"
#include "runtime/arg_parse.h"

namespace dpukv {
namespace {

bool number(const std::string& s, uint32_t* v) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const unsigned long long n = std::strtoull(s.c_str(), nullptr, 10);
  if (n > 0xFFFFFFFEull) return false;
  *v = static_cast<uint32_t>(n);
  return true;
}

// Names read once from the system's user and group databases (NSS may block:
// never on a connection's path for a rule, only when a fallback tenant is made).
std::string user_name(uid_t uid) {
  passwd pw{}, *found = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr)
    return std::string("user:") + pw.pw_name;
  return "uid:" + std::to_string(uid);
}
std::string group_name(gid_t gid) {
  group gr{}, *found = nullptr;
  char buf[4096];
  if (getgrgid_r(gid, &gr, buf, sizeof(buf), &found) == 0 && found != nullptr)
    return std::string("group:") + gr.gr_name;
  return "gid:" + std::to_string(gid);
}

}  // namespace

bool user_id(const std::string& name, uid_t* out) {
  passwd pw{}, *found = nullptr;
  char buf[4096];
  if (getpwnam_r(name.c_str(), &pw, buf, sizeof(buf), &found) != 0 || found == nullptr)
    return false;
  *out = pw.pw_uid;
  return true;
}

bool group_id(const std::string& name, gid_t* out) {
  group gr{}, *found = nullptr;
  char buf[4096];
  if (getgrnam_r(name.c_str(), &gr, buf, sizeof(buf), &found) != 0 || found == nullptr)
    return false;
  *out = gr.gr_gid;
  return true;
}

bool parse_tenant_rule(const std::string& text, TenantRule* out, std::string* err) {
  std::istringstream in(text);
  TenantRule r;
  if (!(in >> r.name)) {
    *err = "a tenant rule needs a name and members (NAME uid:N group:NAME socket:PATH ...)";
    return false;
  }
  // ':' marks the names the agent makes (user:alice): a rule cannot take one.
  if (r.name.find(':') != std::string::npos || r.name.size() > 64) {
    *err = "tenant name '" + r.name + "': at most 64 characters, no ':'";
    return false;
  }
  std::string word;
  bool members = false;
  while (in >> word) {
    const size_t colon = word.find(':');
    const std::string kind = word.substr(0, colon),
                      value = colon == std::string::npos ? "" : word.substr(colon + 1);
    uint32_t n = 0;
    if (kind == "uid" && number(value, &n)) {
      r.uids.push_back(n);
    } else if (kind == "gid" && number(value, &n)) {
      r.gids.push_back(n);
    } else if (kind == "user" && !value.empty()) {
      if (!user_id(value, &n)) {
        *err = "tenant " + r.name + ": no user '" + value + "'";
        return false;
      }
      r.uids.push_back(n);
    } else if (kind == "group" && !value.empty()) {
      if (!group_id(value, &n)) {
        *err = "tenant " + r.name + ": no group '" + value + "'";
        return false;
      }
      r.gids.push_back(n);
    } else if (kind == "socket" && !value.empty() && r.socket.empty()) {
      r.socket = value;
    } else if ((kind == "memory" || kind == "disk" || kind == "staging") && !value.empty()) {
      uint64_t b = 0;
      std::string e;
      if (!parse_byte_size(value, &b, &e)) {
        *err = "tenant " + r.name + ": " + kind + " '" + value + "': " + e;
        return false;
      }
      (kind == "memory" ? r.memory_quota : kind == "disk" ? r.disk_quota : r.staging_quota) = b;
      continue;
    } else {
      *err = "tenant " + r.name + ": '" + word +
             "' is none of uid:N user:NAME gid:N group:NAME socket:PATH memory:SIZE disk:SIZE "
             "staging:SIZE";
      return false;
    }
    members = true;
  }
  if (!members) {
    *err = "tenant " + r.name + ": names no member (uid:, user:, gid:, group: or socket:)";
    return false;
  }
  *out = std::move(r);
  return true;
}

bool parse_tenant_fallback(const std::string& text, TenantFallback* out) {
  for (TenantFallback f : {TenantFallback::kUser, TenantFallback::kGroup, TenantFallback::kShared,
                           TenantFallback::kRefuse})
    if (text == tenant_fallback_name(f)) {
      *out = f;
      return true;
    }
  return false;
}

const char* tenant_fallback_name(TenantFallback f) {
  switch (f) {
    case TenantFallback::kUser:
      return "user";
    case TenantFallback::kGroup:
      return "group";
    case TenantFallback::kShared:
      return "shared";
    case TenantFallback::kRefuse:
      return "refuse";
  }
  return "?";
}

Status Tenants::create(const TenancyOptions& o, std::unique_ptr<Tenants>* out, std::string* why) {
  std::unique_ptr<Tenants> t(new Tenants(o));
  t->self_uid_ = ::geteuid();
  for (const TenantRule& r : o.rules) {
    if (t->by_name_.count(r.name) != 0) {
      *why = "tenant " + r.name + " is named by two rules";
      return Code::kInvalidValue;
    }
    Tenant* tn = t->add(r.name, &r, why);
    if (tn == nullptr) return Code::kInvalidValue;
    t->rule_tenants_.push_back(tn);
    if (!r.socket.empty()) t->sockets_.emplace_back(r.socket, tn);
  }
  *out = std::move(t);
  return Code::kSuccess;
}

// A rule's own quotas win over the defaults.
Tenant* Tenants::add(const std::string& name, const TenantRule* rule, std::string* why) {
  const uint32_t tag = tenant_tag(name);
  auto clash = by_tag_.find(tag);
  if (clash != by_tag_.end()) {  // one in 2^32 a pair: refused, never merged
    *why = "tenants " + clash->second->name + " and " + name +
           " have the same tag (rename one of them)";
    return nullptr;
  }
  if (tenants_.size() >= kMaxTenants + opts_.rules.size()) {
    *why = "the agent holds " + std::to_string(tenants_.size()) + " tenants, its most";
    return nullptr;
  }
  auto t = std::make_unique<Tenant>();
  t->name = name;
  t->tag = tag;
  t->index = static_cast<uint32_t>(tenants_.size());
  const auto pick = [rule](uint64_t TenantRule::*q, uint64_t fallback) {
    return rule != nullptr && rule->*q != 0 ? rule->*q : fallback;
  };
  t->memory_quota = pick(&TenantRule::memory_quota, opts_.memory_quota);
  t->disk_quota = pick(&TenantRule::disk_quota, opts_.disk_quota);
  t->staging_quota = pick(&TenantRule::staging_quota, opts_.staging_quota);
  Tenant* p = t.get();
  tenants_.push_back(std::move(t));
  by_tag_[tag] = p;
  by_name_[name] = p;
  return p;
}

Tenant* Tenants::named(const std::string& name, std::string* why) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  return add(name, nullptr, why);
}

const Tenant* Tenants::resolve(const PeerCred& p, int socket, std::string* why) {
  if (socket >= 0) return sockets_.at(static_cast<size_t>(socket)).second;
  for (size_t i = 0; i < opts_.rules.size(); ++i) {
    const TenantRule& r = opts_.rules[i];
    for (uid_t u : r.uids)
      if (u == p.uid) return rule_tenants_[i];
    for (gid_t g : r.gids)
      if (p.in_group(g)) return rule_tenants_[i];
  }
  switch (opts_.fallback) {
    case TenantFallback::kUser: {
      Tenant*& t = by_uid_[p.uid];  // the user database is read once a uid
      if (t == nullptr) t = named(user_name(p.uid), why);
      if (t == nullptr) by_uid_.erase(p.uid);
      return t;
    }
    case TenantFallback::kGroup: {
      Tenant*& t = by_gid_[p.gid];
      if (t == nullptr) t = named(group_name(p.gid), why);
      if (t == nullptr) by_gid_.erase(p.gid);
      return t;
    }
    case TenantFallback::kShared:
      return named("shared:all", why);  // a rule cannot take the name (no ':')
    case TenantFallback::kRefuse:
      break;
  }
  *why = "uid " + std::to_string(p.uid) + " is in no tenant rule (tenant_by: refuse)";
  return nullptr;
}

bool Tenants::admin(const PeerCred& p) const {
  if (p.uid == 0 || p.uid == self_uid_) return true;
  for (gid_t g : opts_.admin_gids)
    if (p.in_group(g)) return true;
  return false;
}

const Tenant* Tenants::by_tag(uint32_t tag) const {
  auto it = by_tag_.find(tag);
  return it == by_tag_.end() ? nullptr : it->second;
}

}  // namespace dpukv
