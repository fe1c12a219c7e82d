// NVMe/TCP PDUs (NVM Express TCP Transport Specification 1.0): an 8-byte common
// header, then a type-specific header, an optional header digest, padding to the
// data offset, data, and an optional data digest. Digests are CRC32C. Little
// endian, packed as the specification lays them out.
#pragma once

#include <cstdint>
#include <cstring>

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

// SGL descriptor types in an SQE's data pointer (bytes 24..39, type at byte 39).
inline constexpr uint8_t kSglDataBlockOffset = 0x01;     // in-capsule data
inline constexpr uint8_t kSglTransportDataBlock = 0x5a;  // data by R2T/H2CData or C2HData
struct SglDescriptor {
  uint64_t address;
  uint32_t length;
  uint8_t reserved[3];
  uint8_t type;
};
static_assert(sizeof(SglDescriptor) == 16);

// Fabrics commands (opcode 0x7f, fctype at byte 4).
inline constexpr uint8_t kFabricsOpcode = 0x7f;
enum FabricsType : uint8_t {
  kPropertySet = 0x00,
  kConnect = 0x01,
  kPropertyGet = 0x04,
  kDisconnect = 0x08
};
// A fabrics command's fields in the SQE (NVMe over Fabrics 1.1, 3.3-3.5): FCTYPE at
// byte 4, SGL1 at 24; Property Get/Set's ATTRIB at 40 (size: 0 four bytes, 1
// eight), OFST at 44 and VALUE at 48. Little-endian hosts, as the rest of the wire.
inline uint8_t fabrics_type(const Sqe& c) {
  return static_cast<uint8_t>(c.nsid);
}
inline SglDescriptor sgl1(const Sqe& c) {
  SglDescriptor d;
  std::memcpy(&d, &c.prp1, sizeof(d));
  return d;
}
inline uint8_t property_attrib(const Sqe& c) {
  return static_cast<uint8_t>(c.cdw10);
}
inline uint32_t property_offset(const Sqe& c) {
  return c.cdw11;
}
inline uint64_t property_value(const Sqe& c) {
  return c.cdw12 | uint64_t{c.cdw13} << 32;
}
// Connect command fields (byte offsets in the SQE).
inline constexpr uint32_t kConnectRecfmt = 40, kConnectQid = 42, kConnectSqsize = 44,
                          kConnectCattr = 46, kConnectKato = 48;
inline constexpr uint8_t kCattrDisableSqFlowControl = 1u << 2;
struct ConnectData {
  uint8_t hostid[16];
  uint16_t cntlid;
  uint8_t reserved[238];
  char subnqn[256];
  char hostnqn[256];
  uint8_t reserved2[256];
};
static_assert(sizeof(ConnectData) == 1024);
inline constexpr uint16_t kCntlidDynamic = 0xffff;

// Fabrics status codes (command specific).
inline constexpr uint16_t kConnectIncompatibleFormat = make_status(kSctCommandSpecific, 0x80);
inline constexpr uint16_t kConnectControllerBusy = make_status(kSctCommandSpecific, 0x81);
inline constexpr uint16_t kConnectInvalidParameters = make_status(kSctCommandSpecific, 0x82);
inline constexpr uint16_t kConnectInvalidHost = make_status(kSctCommandSpecific, 0x84);
inline constexpr uint16_t kTransientTransportError = make_status(kSctGeneric, 0x22);
inline constexpr uint16_t kSglLengthInvalid = make_status(kSctGeneric, 0x0f);
inline constexpr uint16_t kSglTypeInvalid = make_status(kSctGeneric, 0x11);

inline constexpr const char* kDiscoveryNqn = "nqn.2014-08.org.nvmexpress.discovery";

}  // namespace dpukv::nvme::tcp
