#include "runtime/buf.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/mmap.h"

namespace dpukv {
namespace {

class BufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_.resize(1 << 16);
    ASSERT_TRUE(Mmap::create(mem_.data(), mem_.size(), kAccessLocalReadWrite, -1, 0, &map_).ok());
    ASSERT_TRUE(map_->start().ok());
    ASSERT_TRUE(BufInventory::create(4, &inv_).ok());
  }
  std::vector<uint8_t> mem_;
  std::unique_ptr<Mmap> map_;
  std::unique_ptr<BufInventory> inv_;
};

TEST_F(BufTest, GetByAddrAndByData) {
  Buf* a = nullptr;
  ASSERT_TRUE(inv_->get_by_addr(map_.get(), mem_.data() + 100, 200, &a).ok());
  EXPECT_EQ(a->head(), mem_.data() + 100);
  EXPECT_EQ(a->len(), 200u);
  EXPECT_EQ(a->data(), a->head());
  EXPECT_EQ(a->data_len(), 0u);
  EXPECT_EQ(a->tail_room(), 200u);
  Buf* b = nullptr;
  ASSERT_TRUE(inv_->get_by_data(map_.get(), mem_.data(), 50, &b).ok());
  EXPECT_EQ(b->data_len(), 50u);
  EXPECT_EQ(b->tail_room(), 0u);
  EXPECT_EQ(map_->live_buffers(), 2u);
  EXPECT_TRUE(a->dec_refcount().ok());
  EXPECT_TRUE(b->dec_refcount().ok());
  EXPECT_EQ(map_->live_buffers(), 0u);
}

TEST_F(BufTest, NeverOutsideItsMap) {
  Buf* b = nullptr;
  EXPECT_EQ(inv_->get_by_addr(map_.get(), mem_.data() + mem_.size() - 10, 11, &b),
            Code::kInvalidValue);
  EXPECT_EQ(inv_->get_by_addr(map_.get(), mem_.data() - 1, 10, &b), Code::kInvalidValue);
  EXPECT_EQ(inv_->get_by_addr(map_.get(), mem_.data(), SIZE_MAX, &b), Code::kInvalidValue);
  EXPECT_EQ(inv_->get_by_addr(map_.get(), mem_.data(), 0, &b), Code::kInvalidValue);
  ASSERT_TRUE(inv_->get_by_addr(map_.get(), mem_.data() + 1000, 100, &b).ok());
  EXPECT_EQ(b->set_data(mem_.data() + 999, 1), Code::kInvalidValue);
  EXPECT_EQ(b->set_data(mem_.data() + 1050, 51), Code::kInvalidValue);
  EXPECT_EQ(b->set_data(mem_.data() + 1000, SIZE_MAX), Code::kInvalidValue);
  EXPECT_TRUE(b->set_data(mem_.data() + 1050, 50).ok());
  EXPECT_EQ(b->set_data_len(51), Code::kInvalidValue);
  EXPECT_TRUE(b->set_data_len(10).ok());
  EXPECT_EQ(b->tail_room(), 40u);
  EXPECT_TRUE(b->dec_refcount().ok());
}

TEST_F(BufTest, StoppedMapGivesNoBuffersAndLiveBuffersBlockStop) {
  Buf* b = nullptr;
  ASSERT_TRUE(inv_->get_by_addr(map_.get(), mem_.data(), 10, &b).ok());
  EXPECT_EQ(map_->stop(), Code::kBadState);
  EXPECT_TRUE(b->dec_refcount().ok());
  EXPECT_TRUE(map_->stop().ok());
  EXPECT_EQ(inv_->get_by_addr(map_.get(), mem_.data(), 10, &b), Code::kBadState);
  ASSERT_TRUE(map_->start().ok());
}

TEST_F(BufTest, RefcountReturnsToInventoryAtZero) {
  Buf* b = nullptr;
  ASSERT_TRUE(inv_->get_by_addr(map_.get(), mem_.data(), 10, &b).ok());
  EXPECT_EQ(inv_->num_free(), 3u);
  uint16_t rc = 0;
  ASSERT_TRUE(b->inc_refcount(&rc).ok());
  EXPECT_EQ(rc, 2);
  ASSERT_TRUE(b->dec_refcount(&rc).ok());
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(inv_->num_free(), 3u);
  ASSERT_TRUE(b->dec_refcount(&rc).ok());
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(inv_->num_free(), 4u);
  EXPECT_EQ(b->dec_refcount(), Code::kBadState);  // already released
  EXPECT_EQ(b->inc_refcount(), Code::kBadState);
}

TEST_F(BufTest, InventoryExhaustion) {
  Buf* b[5] = {};
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(inv_->get_by_addr(map_.get(), mem_.data(), 8, &b[i]).ok());
  EXPECT_EQ(inv_->num_free(), 0u);
  EXPECT_EQ(inv_->get_by_addr(map_.get(), mem_.data(), 8, &b[4]), Code::kNoMemory);
  ASSERT_TRUE(b[2]->dec_refcount().ok());
  EXPECT_TRUE(inv_->get_by_addr(map_.get(), mem_.data(), 8, &b[4]).ok());
  for (int i : {0, 1, 3, 4}) ASSERT_TRUE(b[i]->dec_refcount().ok());
  EXPECT_EQ(inv_->num_free(), 4u);
}

TEST_F(BufTest, ChainUnchainAndReleaseWholeList) {
  Buf *a, *b, *c;
  ASSERT_TRUE(inv_->get_by_data(map_.get(), mem_.data(), 10, &a).ok());
  ASSERT_TRUE(inv_->get_by_data(map_.get(), mem_.data() + 10, 20, &b).ok());
  ASSERT_TRUE(inv_->get_by_data(map_.get(), mem_.data() + 30, 30, &c).ok());
  ASSERT_TRUE(buf_chain_list(a, b).ok());
  ASSERT_TRUE(buf_chain_list(a, c).ok());
  EXPECT_EQ(a->list_len(), 3u);
  EXPECT_EQ(a->next(), b);
  EXPECT_EQ(b->next(), c);
  EXPECT_EQ(buf_chain_list(a, b), Code::kInvalidValue);  // already in a list
  EXPECT_EQ(buf_chain_list(a, a), Code::kInvalidValue);
  EXPECT_EQ(b->dec_refcount(), Code::kNotPermitted);  // the head owns it
  ASSERT_TRUE(buf_unchain_list(a, c).ok());
  EXPECT_EQ(a->list_len(), 2u);
  EXPECT_EQ(c->list_len(), 1u);
  EXPECT_EQ(buf_unchain_list(a, c), Code::kNotFound);
  ASSERT_TRUE(c->dec_refcount().ok());
  EXPECT_EQ(inv_->num_free(), 2u);
  ASSERT_TRUE(a->dec_refcount().ok());  // releases a and b
  EXPECT_EQ(inv_->num_free(), 4u);
  EXPECT_EQ(map_->live_buffers(), 0u);
}

TEST_F(BufTest, SharedBufferCannotJoinAList) {
  Buf *a, *b;
  ASSERT_TRUE(inv_->get_by_data(map_.get(), mem_.data(), 10, &a).ok());
  ASSERT_TRUE(inv_->get_by_data(map_.get(), mem_.data(), 10, &b).ok());
  ASSERT_TRUE(b->inc_refcount().ok());
  EXPECT_EQ(buf_chain_list(a, b), Code::kBadState);
  ASSERT_TRUE(b->dec_refcount().ok());
  ASSERT_TRUE(b->dec_refcount().ok());
  ASSERT_TRUE(a->dec_refcount().ok());
}

}  // namespace
}  // namespace dpukv
