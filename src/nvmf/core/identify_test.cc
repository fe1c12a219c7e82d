// The Identify pages, field by field at the offsets of NVMe Base 2.0 (5.17.2) and
// NVMe over Fabrics 1.1, without a controller.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nvme/nvme_spec.h"
#include "nvmf/core/identify.h"
#include "testing/spec_bytes_for_tests.h"

namespace dpukv::nvme {
namespace {

using test_bytes::ascii;
using test_bytes::u16;
using test_bytes::u32;
using test_bytes::u64;

ControllerConfig config() {
  ControllerConfig c;
  c.serial = "SN-1";
  c.model = "model";
  c.firmware = "1.2";
  c.subnqn = "nqn.2026-11.io.dpukv:test";
  c.vendor_id = 0x1234;
  c.cntlid = 7;
  c.mqes = 127;
  c.mdts = 5;
  c.in_capsule_bytes = 8192;
  return c;
}

TEST(Identify, AnIoControllerOverPcie) {
  std::vector<uint8_t> d(kIdentifySize, 0);
  identify_controller(config(), IdentifyLimits{4, 4, 8, 32}, d.data());
  EXPECT_EQ(u16(&d[0]), 0x1234);                        // VID
  EXPECT_EQ(ascii(&d[4], 20), "SN-1                ");  // SN, space padded
  EXPECT_EQ(ascii(&d[24], 5), "model");
  EXPECT_EQ(d[24 + 39], ' ');
  EXPECT_EQ(ascii(&d[64], 8), "1.2     ");  // FR
  EXPECT_EQ(d[77], 5);                      // MDTS
  EXPECT_EQ(u16(&d[78]), 7);                // CNTLID
  EXPECT_EQ(u32(&d[80]), 0x00010400u);      // VER 1.4
  EXPECT_EQ(d[111], 1);                     // CNTRLTYPE: I/O
  EXPECT_EQ(d[258], 3);                     // ACL
  EXPECT_EQ(d[259], 3);                     // AERL
  EXPECT_EQ(d[262], 7);                     // ELPE
  EXPECT_EQ(d[512], 0x66);                  // SQES
  EXPECT_EQ(d[513], 0x44);                  // CQES
  EXPECT_EQ(u32(&d[516]), 32u);             // NN
  EXPECT_EQ(u16(&d[520]) & 0x04, 0x04);     // ONCS: DSM
  EXPECT_EQ(ascii(&d[768], 25), "nqn.2026-11.io.dpukv:test");
  EXPECT_EQ(d[768 + 25], 0) << "SUBNQN is NUL terminated";
  // No fabrics fields on PCIe.
  EXPECT_EQ(u16(&d[514]), 0);   // MAXCMD
  EXPECT_EQ(u32(&d[536]), 0u);  // SGLS
  EXPECT_EQ(u32(&d[1792]), 0u);
}

TEST(Identify, AnIoControllerOverFabrics) {
  ControllerConfig c = config();
  c.fabrics = true;
  std::vector<uint8_t> d(kIdentifySize, 0);
  identify_controller(c, IdentifyLimits{}, d.data());
  EXPECT_EQ(u32(&d[96]) & (1u << 6), 1u << 6);  // CTRATT: traffic-based keep alive
  EXPECT_EQ(u16(&d[514]), 128);                 // MAXCMD = MQES + 1
  EXPECT_EQ(u32(&d[536]) & 1u, 1u);             // SGLs supported
  EXPECT_EQ(u32(&d[1792]), (64u + 8192) / 16);  // IOCCSZ in 16-byte units
  EXPECT_EQ(u32(&d[1796]), 1u);                 // IORCSZ
  EXPECT_EQ(d[1803], 1);                        // MSDBD
}

TEST(Identify, ADiscoveryController) {
  ControllerConfig c = config();
  c.fabrics = c.discovery = true;
  std::vector<uint8_t> d(kIdentifySize, 0);
  identify_controller(c, IdentifyLimits{}, d.data());
  EXPECT_EQ(d[111], 2);              // CNTRLTYPE: discovery
  EXPECT_EQ(u32(&d[92]), 1u << 31);  // OAES: discovery log change notices
  EXPECT_EQ(u32(&d[516]), 0u) << "NN: a discovery controller has no namespaces";
  EXPECT_EQ(d[512], 0) << "no I/O queue entry sizes";
  EXPECT_EQ(u16(&d[514]), 128);
  EXPECT_EQ(ascii(&d[768], 25), "nqn.2026-11.io.dpukv:test");
}

TEST(Identify, NamespacesAndTheirNguids) {
  uint8_t a[16], b[16], a2[16], other[16];
  namespace_nguid("SN-1", 1, a);
  namespace_nguid("SN-1", 2, b);
  namespace_nguid("SN-1", 1, a2);
  namespace_nguid("SN-2", 1, other);
  EXPECT_EQ(std::memcmp(a, a2, 16), 0) << "stable";
  EXPECT_NE(std::memcmp(a, b, 16), 0) << "per namespace";
  EXPECT_NE(std::memcmp(a, other, 16), 0) << "per serial number";

  std::vector<uint8_t> d(kIdentifySize, 0);
  identify_namespace(1000, 4096, a, d.data());
  EXPECT_EQ(u64(&d[0]), 1000u);   // NSZE
  EXPECT_EQ(u64(&d[8]), 1000u);   // NCAP
  EXPECT_EQ(u64(&d[16]), 1000u);  // NUSE
  EXPECT_EQ(d[25], 0);            // NLBAF: one format
  EXPECT_EQ(std::memcmp(&d[104], a, 16), 0);
  EXPECT_EQ(d[130], 12) << "LBAF0.LBADS: 2^12 = 4096";

  std::vector<uint8_t> n(kIdentifySize, 0);
  namespace_descriptors(a, n.data());
  EXPECT_EQ(n[0], 2);   // NIDT: NGUID
  EXPECT_EQ(n[1], 16);  // NIDL
  EXPECT_EQ(std::memcmp(&n[4], a, 16), 0);
  EXPECT_EQ(n[20], 0) << "one descriptor, then the end";
}

}  // namespace
}  // namespace dpukv::nvme
