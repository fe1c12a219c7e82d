// NVMe over Fabrics definitions shared by every transport (NVMe over Fabrics 1.1):
// the fabrics commands (Connect, Property Get/Set, Disconnect) as they sit in an
// SQE, the SGL descriptors that point at their data, the Connect data, and the
// fabrics status codes. Transport wire formats (nvme/tcp_wire.h) build on these;
// the controller core reads them without knowing any transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "nvme/nvme_spec.h"

namespace dpukv::nvme {

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
// The Connect command (NVMe over Fabrics 1.1, 3.3): the SQE as the specification
// lays it out. Read and written whole (memcpy of the SQE), never at bare offsets.
struct ConnectCommand {
  uint8_t opcode;  // kFabricsOpcode
  uint8_t psdt;
  uint16_t cid;
  uint8_t fctype;  // kConnect
  uint8_t reserved1[19];
  SglDescriptor sgl1;  // the Connect data (in-capsule)
  uint16_t recfmt;     // 0
  uint16_t qid;
  uint16_t sqsize;  // 0's based
  uint8_t cattr;
  uint8_t reserved2;
  uint32_t kato;  // ms, the admin queue's
  uint8_t reserved3[12];
};
static_assert(sizeof(ConnectCommand) == sizeof(Sqe));
static_assert(offsetof(ConnectCommand, sgl1) == 24 && offsetof(ConnectCommand, recfmt) == 40 &&
              offsetof(ConnectCommand, qid) == 42 && offsetof(ConnectCommand, sqsize) == 44 &&
              offsetof(ConnectCommand, cattr) == 46 && offsetof(ConnectCommand, kato) == 48);
inline ConnectCommand connect_command(const Sqe& c) {
  ConnectCommand cc;
  std::memcpy(&cc, &c, sizeof cc);
  return cc;
}
inline Sqe to_sqe(const ConnectCommand& cc) {
  Sqe c;
  std::memcpy(&c, &cc, sizeof c);
  return c;
}
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

}  // namespace dpukv::nvme
