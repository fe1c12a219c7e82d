// NVMe/TCP PDUs (NVM Express TCP Transport Specification 1.0): an 8-byte common
// header, then a type-specific header, an optional header digest, padding to the
// data offset, data, and an optional data digest. Digests are CRC32C. Little
// endian, packed as the specification lays them out.
#pragma once

#include <cstdint>
#include <cstring>

#include "nvme/fabrics_spec.h"
#include "nvme/nvme_spec.h"

namespace dpukv::nvme::tcp {

inline constexpr uint16_t kDefaultPort = 4420;
inline constexpr uint16_t kDiscoveryPort = 8009;
inline constexpr uint32_t kDigestLen = 4;

enum PduType : uint8_t {
  kIcReq = 0x00,
  kIcResp = 0x01,
  kH2CTermReq = 0x02,
  kC2HTermReq = 0x03,
  kCapsuleCmd = 0x04,
  kCapsuleResp = 0x05,
  kH2CData = 0x06,
  kC2HData = 0x07,
  kR2T = 0x09,
};

inline constexpr uint8_t kFlagHdgst = 1u << 0;
inline constexpr uint8_t kFlagDdgst = 1u << 1;
inline constexpr uint8_t kFlagLastPdu = 1u << 2;  // H2CData / C2HData
inline constexpr uint8_t kFlagSuccess = 1u << 3;  // C2HData: no response capsule follows

inline constexpr uint8_t kDigestHeader = 1u << 0;  // ICReq/ICResp dgst field
inline constexpr uint8_t kDigestData = 1u << 1;

enum FatalErrorStatus : uint16_t {
  kFesInvalidHeader = 0x01,
  kFesPduSequence = 0x02,
  kFesHeaderDigest = 0x03,
  kFesDataOutOfRange = 0x04,
  kFesDataLimitExceeded = 0x05,
  kFesUnsupportedParameter = 0x06,
};

#pragma pack(push, 1)
struct CommonHeader {
  uint8_t type, flags, hlen, pdo;
  uint32_t plen;
};
struct IcReq {
  CommonHeader ch;
  uint16_t pfv;
  uint8_t hpda, dgst;
  uint32_t maxr2t;
  uint8_t reserved[112];
};
struct IcResp {
  CommonHeader ch;
  uint16_t pfv;
  uint8_t cpda, dgst;
  uint32_t maxh2cdata;
  uint8_t reserved[112];
};
struct TermReq {
  CommonHeader ch;
  uint16_t fes;
  uint32_t fei;
  uint8_t reserved[10];
};
struct CapsuleCmd {
  CommonHeader ch;
  Sqe sqe;
};
struct CapsuleResp {
  CommonHeader ch;
  Cqe cqe;
};
struct DataHeader {  // H2CData and C2HData
  CommonHeader ch;
  uint16_t cccid, ttag;
  uint32_t datao, datal;
  uint32_t reserved;
};
struct R2THeader {
  CommonHeader ch;
  uint16_t cccid, ttag;
  uint32_t r2to, r2tl;
  uint32_t reserved;
};
#pragma pack(pop)
static_assert(sizeof(CommonHeader) == 8);
static_assert(sizeof(IcReq) == 128 && sizeof(IcResp) == 128);
static_assert(sizeof(TermReq) == 24);
static_assert(sizeof(CapsuleCmd) == 72 && sizeof(CapsuleResp) == 24);
static_assert(sizeof(DataHeader) == 24 && sizeof(R2THeader) == 24);

}  // namespace dpukv::nvme::tcp
