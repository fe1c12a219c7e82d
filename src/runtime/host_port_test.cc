#include "runtime/host_port.h"

#include <gtest/gtest.h>

namespace dpukv {
namespace {

TEST(HostPort, OneParserForEveryEndpointFlag) {
  std::string h;
  uint16_t p = 0;
  ASSERT_TRUE(parse_host_port("127.0.0.1:4420", &h, &p));
  EXPECT_EQ(h, "127.0.0.1");
  EXPECT_EQ(p, 4420);
  ASSERT_TRUE(parse_host_port("localhost:0", &h, &p));
  EXPECT_EQ(p, 0);
  ASSERT_TRUE(parse_host_port("10.0.0.1", &h, &p, 4420));  // the default port
  EXPECT_EQ(p, 4420);
  EXPECT_FALSE(parse_host_port("10.0.0.1", &h, &p));  // no default: a port is required
  for (const char* bad : {"host:70000", "host:-1", "host:12x", "host: 80", ":4420", "host:999999"})
    EXPECT_FALSE(parse_host_port(bad, &h, &p, 4420)) << bad;
}

}  // namespace
}  // namespace dpukv
