// The event feed without an agent: who sees which events, how they are cut into
// messages, what a full queue and a failed send say. The agent's use of it (real
// sessions, sends, tenants) runs in AgentTest and cli.tenants.
#include "agent/event_feed.h"

#include <gtest/gtest.h>

#include <cstring>

#include "protocol/tenant_key.h"

namespace dpukv {
namespace {

ChunkKey kept(uint64_t model, uint32_t tag, uint64_t hash) {
  ChunkKey client{};
  client.model = model;
  client.world_size = 1;
  client.rank = 0;
  client.prefix_hash = hash;
  ChunkKey k;
  EXPECT_TRUE(tenant_scope(client, tag, &k));
  return k;
}

struct Message {
  agent::AgentHeader h;
  std::vector<agent::ChunkEvent> events;
};

std::vector<Message> drain(const EventFeed& feed, const FeedSubscriber& s, uint32_t per_msg) {
  std::vector<Message> out;
  std::vector<uint8_t> msg;
  size_t cursor = 0;
  while (uint32_t n = feed.next_message(s, &cursor, per_msg, &msg)) {
    Message m;
    std::memcpy(&m.h, msg.data(), sizeof(m.h));
    EXPECT_EQ(msg.size(), sizeof(m.h) + n * sizeof(agent::ChunkEvent));
    m.events.resize(n);
    std::memcpy(m.events.data(), msg.data() + sizeof(m.h), n * sizeof(agent::ChunkEvent));
    out.push_back(m);
  }
  EXPECT_EQ(cursor, feed.pending());
  return out;
}

TEST(EventFeed, EachSubscriberSeesItsModelAndTenantAsItsClientNamedThem) {
  EventFeed feed;
  FeedSubscriber alice{.model = 7, .tenant_tag = 11};
  FeedSubscriber any_model{.model = 0, .tenant_tag = 11};
  FeedSubscriber admin{.model = 0, .tenant_tag = 99, .all_tenants = true};
  EXPECT_TRUE(feed.add(&alice));  // the first: the agent starts listening
  EXPECT_FALSE(feed.add(&any_model));
  EXPECT_FALSE(feed.add(&admin));
  EXPECT_FALSE(feed.add(&alice));  // once only
  EXPECT_EQ(feed.subscribers(), 3u);
  ASSERT_TRUE(feed.record(kept(7, 11, 1), true));
  ASSERT_TRUE(feed.record(kept(8, 11, 2), true));   // another model
  ASSERT_TRUE(feed.record(kept(7, 22, 3), false));  // another tenant

  auto a = drain(feed, alice, 64);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(a[0].events.size(), 1u);
  EXPECT_EQ(a[0].events[0].key.prefix_hash, 1u);
  EXPECT_EQ(a[0].events[0].key.world_size, 1u);  // unscoped: the client's key again
  EXPECT_EQ(a[0].events[0].key.rank, 0u);
  EXPECT_EQ(a[0].events[0].present, 1);
  EXPECT_EQ(a[0].events[0].tenant, 0u);  // not an admin's feed: no tenant said
  EXPECT_EQ(a[0].h.op, static_cast<uint16_t>(agent::Op::kEvents) | agent::kResponse);
  EXPECT_EQ(a[0].h.count, 1u);
  EXPECT_EQ(a[0].h.flags, 0);

  auto m = drain(feed, any_model, 64);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].events.size(), 2u);  // both of its tenant's, any model

  auto all = drain(feed, admin, 64);
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(all[0].events.size(), 3u);
  EXPECT_EQ(all[0].events[2].tenant, 22u);  // an admin's feed says whose
  EXPECT_EQ(all[0].events[2].present, 0);

  feed.sent();
  EXPECT_EQ(feed.pending(), 0u);
  EXPECT_TRUE(drain(feed, admin, 64).empty());
}

TEST(EventFeed, MessagesHoldAtMostPerMsgEvents) {
  EventFeed feed;
  FeedSubscriber s{.model = 0, .tenant_tag = 5};
  feed.add(&s);
  for (uint64_t i = 0; i < 10; ++i) feed.record(kept(1, 5, i), true);
  auto msgs = drain(feed, s, 4);
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[0].events.size(), 4u);
  EXPECT_EQ(msgs[1].events.size(), 4u);
  EXPECT_EQ(msgs[2].events.size(), 2u);
  EXPECT_EQ(msgs[2].events[1].key.prefix_hash, 9u);  // in order
}

TEST(EventFeed, AFullQueueAndAFailedSendAreSaidInTheNextMessage) {
  EventFeed feed;
  FeedSubscriber s{.model = 0, .tenant_tag = 5};
  FeedSubscriber other{.model = 0, .tenant_tag = 5};
  feed.add(&s);
  feed.add(&other);
  for (size_t i = 0; i < EventFeed::kMaxPending; ++i) ASSERT_TRUE(feed.record(kept(1, 5, i), true));
  EXPECT_FALSE(feed.record(kept(1, 5, 1u << 30), true));  // dropped, the newest
  EXPECT_EQ(feed.pending(), EventFeed::kMaxPending);
  auto msgs = drain(feed, s, 1u << 20);
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0].h.flags, agent::kEventsLost);
  feed.sent();
  feed.record(kept(1, 5, 1), true);
  EXPECT_EQ(drain(feed, s, 64)[0].h.flags, 0);  // said once
  other.lost = true;                            // its last message could not be sent
  EXPECT_EQ(drain(feed, other, 64)[0].h.flags, agent::kEventsLost);
}

TEST(EventFeed, TheLastSubscriberGoneDropsTheQueue) {
  EventFeed feed;
  FeedSubscriber a{.tenant_tag = 5}, b{.tenant_tag = 5};
  feed.add(&a);
  feed.add(&b);
  feed.record(kept(1, 5, 1), true);
  EXPECT_FALSE(feed.remove(&a));
  EXPECT_EQ(feed.pending(), 1u);
  EXPECT_FALSE(feed.remove(&a));  // not there any more
  EXPECT_TRUE(feed.remove(&b));   // the last: the agent stops listening
  EXPECT_EQ(feed.pending(), 0u);
  EXPECT_EQ(feed.subscribers(), 0u);
}

}  // namespace
}  // namespace dpukv
