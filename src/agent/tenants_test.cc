// Tenancy without an agent: rules as an admin writes them (and the ones it gets
// wrong), the tenant each kind of peer lands in, admins, and the key fold that
// keeps tenants apart (protocol/tenant_key.h). The agent's own enforcement runs in
// cli.tenants (tests/cli_tenants_test.sh) with clients under other uids.
#include "agent/tenants.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "protocol/tenant_key.h"

namespace dpukv {
namespace {

PeerCred peer(uid_t uid, gid_t gid, std::initializer_list<gid_t> groups = {}) {
  PeerCred p;
  p.uid = uid;
  p.gid = gid;
  for (gid_t g : groups) p.groups[p.ngroups++] = g;
  return p;
}

TenantRule rule(const std::string& text) {
  TenantRule r;
  std::string err;
  EXPECT_TRUE(parse_tenant_rule(text, &r, &err)) << text << ": " << err;
  return r;
}

TEST(TenantRules, WhatAnAdminWritesIsReadAndMistakesSayWhy) {
  TenantRule r = rule(
      "chat uid:1200 gid:4242 group:root socket:/run/a.sock memory:2G disk:64M "
      "staging:1M");
  EXPECT_EQ(r.name, "chat");
  EXPECT_EQ(r.uids, std::vector<uid_t>({1200}));
  EXPECT_EQ(r.gids, std::vector<gid_t>({4242, 0}));
  EXPECT_EQ(r.socket, "/run/a.sock");
  EXPECT_EQ(r.memory_quota, 2ull << 30);
  EXPECT_EQ(r.disk_quota, 64ull << 20);
  EXPECT_EQ(r.staging_quota, 1ull << 20);
  EXPECT_EQ(rule("ops user:root").uids, std::vector<uid_t>({0}));

  const std::pair<const char*, const char*> bad[] = {
      {"", "needs a name"},
      {"lonely", "names no member"},
      {"q memory:1G", "names no member"},  // a quota is not a member
      {"user:alice uid:1", "no ':'"},      // the agent's own names
      {"x uid:abc", "is none of"},
      {"x uid:-1", "is none of"},
      {"x uid:99999999999", "is none of"},
      {"x pid:5", "is none of"},
      {"x socket:", "is none of"},
      {"x user:no-such-user-here", "no user"},
      {"x group:no-such-group-here", "no group"},
      {"x uid:1 memory:lots", "memory 'lots'"},
  };
  for (const auto& [text, why] : bad) {
    TenantRule out;
    std::string err;
    EXPECT_FALSE(parse_tenant_rule(text, &out, &err)) << text;
    EXPECT_NE(err.find(why), std::string::npos) << text << ": " << err;
  }
  TenantFallback f;
  EXPECT_TRUE(parse_tenant_fallback("refuse", &f));
  EXPECT_EQ(f, TenantFallback::kRefuse);
  EXPECT_FALSE(parse_tenant_fallback("everyone", &f));
}

TEST(Tenants, PeersLandByRuleBySocketOrByFallbackNeverInAnothers) {
  TenancyOptions o;
  o.rules = {rule("team gid:4242"), rule("batch uid:1200 memory:1M"), rule("pod socket:/x.sock")};
  o.memory_quota = 8 << 20;
  o.staging_quota = 4 << 20;
  std::unique_ptr<Tenants> t;
  std::string why;
  ASSERT_TRUE(Tenants::create(o, &t, &why).ok()) << why;
  ASSERT_EQ(t->sockets().size(), 1u);
  EXPECT_EQ(t->sockets()[0].first, "/x.sock");

  EXPECT_EQ(t->resolve(peer(1003, 4242), -1, &why)->name, "team");            // primary group
  EXPECT_EQ(t->resolve(peer(1004, 100, {7, 4242}), -1, &why)->name, "team");  // supplementary
  const Tenant* batch = t->resolve(peer(1200, 100), -1, &why);
  EXPECT_EQ(batch->name, "batch");
  EXPECT_EQ(batch->memory_quota, 1u << 20);   // the rule's own
  EXPECT_EQ(batch->staging_quota, 4u << 20);  // the default
  // The socket decides, whoever connects there (even a team member).
  EXPECT_EQ(t->resolve(peer(1003, 4242), 0, &why)->name, "pod");
  // Others: one tenant a user, made once, with the default quota.
  const Tenant* a = t->resolve(peer(54321, 54321), -1, &why);
  const Tenant* b = t->resolve(peer(54322, 54321), -1, &why);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_NE(a->tag, b->tag);
  EXPECT_EQ(a->name, "uid:54321");
  EXPECT_EQ(a->memory_quota, 8u << 20);
  EXPECT_EQ(t->resolve(peer(54321, 1), -1, &why), a);
  EXPECT_EQ(t->by_tag(a->tag), a);
  EXPECT_EQ(t->resolve(peer(0, 0), -1, &why)->name, "user:root");

  o.fallback = TenantFallback::kGroup;
  ASSERT_TRUE(Tenants::create(o, &t, &why).ok());
  EXPECT_EQ(t->resolve(peer(54321, 777), -1, &why), t->resolve(peer(54322, 777), -1, &why));
  EXPECT_EQ(t->resolve(peer(54321, 777), -1, &why)->name, "gid:777");
  o.fallback = TenantFallback::kShared;
  ASSERT_TRUE(Tenants::create(o, &t, &why).ok());
  EXPECT_EQ(t->resolve(peer(54321, 1), -1, &why)->name, "shared:all");
  EXPECT_EQ(t->resolve(peer(1200, 1), -1, &why)->name, "batch");  // rules still first
  o.fallback = TenantFallback::kRefuse;
  ASSERT_TRUE(Tenants::create(o, &t, &why).ok());
  EXPECT_EQ(t->resolve(peer(54321, 1), -1, &why), nullptr);
  EXPECT_NE(why.find("in no tenant rule"), std::string::npos) << why;
  EXPECT_EQ(t->resolve(peer(1200, 1), -1, &why)->name, "batch");

  o.rules.push_back(rule("team uid:5"));
  EXPECT_EQ(Tenants::create(o, &t, &why), Code::kInvalidValue);
  EXPECT_NE(why.find("named by two rules"), std::string::npos) << why;
}

TEST(Tenants, AdminsAreRootTheAgentsUserAndTheAdminGroup) {
  TenancyOptions o;
  o.admin_gids = {600};
  std::unique_ptr<Tenants> t;
  std::string why;
  ASSERT_TRUE(Tenants::create(o, &t, &why).ok());
  EXPECT_TRUE(t->admin(peer(0, 0)));
  EXPECT_TRUE(t->admin(peer(::geteuid(), 1)));
  EXPECT_TRUE(t->admin(peer(54321, 1, {600})));
  EXPECT_FALSE(t->admin(peer(54321, 1, {601})));
}

// The fold is one-to-one and keeps tenants apart whatever keys they send; keys
// it cannot fold are refused, never folded into another's.
TEST(TenantKey, FoldIsOneToOneAndRefusesWhatDoesNotFit) {
  ChunkKey k;
  k.model = 9;
  k.world_size = 8;
  k.rank = 5;
  k.layout = 3;
  k.prefix_hash = 0x1234;
  const uint32_t a = tenant_tag("user:alice"), b = tenant_tag("user:bob");
  EXPECT_NE(a, b);
  EXPECT_EQ(a, tenant_tag("user:alice"));  // by name: agents on other machines agree
  ChunkKey ka, kb;
  ASSERT_TRUE(tenant_scope(k, a, &ka));
  ASSERT_TRUE(tenant_scope(k, b, &kb));
  EXPECT_FALSE(ka == kb);
  EXPECT_EQ(key_tenant(ka), a);
  EXPECT_TRUE(tenant_unscope(ka) == k);
  // Bob choosing world size and rank cannot reach Alice's key.
  ChunkKey forged = ka;  // Alice's kept key, sent as Bob's own
  ChunkKey kept;
  EXPECT_TRUE(!tenant_scope(forged, b, &kept) || key_tenant(kept) == b);
  for (auto [ws, rank] : {std::pair<uint32_t, uint32_t>{0, 0}, {65536, 0}, {4, 4}, {1, 7}}) {
    ChunkKey bad = k;
    bad.world_size = ws;
    bad.rank = rank;
    EXPECT_FALSE(tenant_scope(bad, a, &kept)) << ws << " " << rank;
  }
  ChunkKey edge = k;
  edge.world_size = 65535;
  edge.rank = 65534;
  ASSERT_TRUE(tenant_scope(edge, a, &kept));
  EXPECT_TRUE(tenant_unscope(kept) == edge);
  ASSERT_TRUE(tenant_scope(k, a, &k));  // in place
  EXPECT_TRUE(k == ka);
}

}  // namespace
}  // namespace dpukv
