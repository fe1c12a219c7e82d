// NVMe definitions this controller and its host driver share: register offsets and
// fields, queue entry layouts, opcodes and status codes (NVM Express Base 2.0, NVM
// Command Set 1.0, PCIe Transport 1.0). Only what the code uses is named here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace dpukv::nvme {

// Controller registers, offsets into BAR0.
enum Reg : uint32_t {
  kRegCap = 0x00,  // 64-bit
  kRegVs = 0x08,
  kRegIntms = 0x0c,
  kRegIntmc = 0x10,
  kRegCc = 0x14,
  kRegCsts = 0x1c,
  kRegNssr = 0x20,
  kRegAqa = 0x24,
  kRegAsq = 0x28,  // 64-bit
  kRegAcq = 0x30,  // 64-bit
  kRegEnd = 0x40,  // CMB, BP and PMR registers are not implemented and read 0
};

// BAR0 layout of the BlueField NVMe emulation: registers, doorbells, MSI-X.
inline constexpr uint32_t kDoorbellBase = 0x1000;
inline constexpr uint32_t kDoorbellPageSize = 0x1000;
inline constexpr uint32_t kMsixTableOffset = 0x2000;
inline constexpr uint32_t kMsixPbaOffset = 0x3000;
inline constexpr uint32_t kBar0Size = 0x4000;
// CAP.DSTRD = 0: SQ y tail at 0x1000 + 8y, CQ y head at 0x1000 + 8y + 4.
inline constexpr uint32_t kMaxQueuePairs = kDoorbellPageSize / 8;  // admin + 511 I/O

// CC fields.
inline constexpr uint32_t kCcEn = 1u << 0;
inline uint32_t cc_css(uint32_t cc) {
  return (cc >> 4) & 7;
}
inline uint32_t cc_mps(uint32_t cc) {
  return (cc >> 7) & 0xf;
}
inline uint32_t cc_ams(uint32_t cc) {
  return (cc >> 11) & 7;
}
inline uint32_t cc_shn(uint32_t cc) {
  return (cc >> 14) & 3;
}
inline uint32_t cc_iosqes(uint32_t cc) {
  return (cc >> 16) & 0xf;
}
inline uint32_t cc_iocqes(uint32_t cc) {
  return (cc >> 20) & 0xf;
}
// CSTS fields.
inline constexpr uint32_t kCstsRdy = 1u << 0;
inline constexpr uint32_t kCstsCfs = 1u << 1;
inline constexpr uint32_t kCstsShstMask = 3u << 2;
inline constexpr uint32_t kCstsShstComplete = 2u << 2;
inline constexpr uint32_t kCstsPp = 1u << 5;

// Submission queue entry (64 bytes) and completion queue entry (16 bytes).
struct Sqe {
  uint8_t opc;
  uint8_t flags;  // FUSE 1:0, PSDT 7:6
  uint16_t cid;
  uint32_t nsid;
  uint32_t cdw2, cdw3;
  uint64_t mptr;
  uint64_t prp1, prp2;
  uint32_t cdw10, cdw11, cdw12, cdw13, cdw14, cdw15;
};
static_assert(sizeof(Sqe) == 64);

struct Cqe {
  uint32_t dw0;
  uint32_t dw1;
  uint16_t sq_head;
  uint16_t sq_id;
  uint16_t cid;
  uint16_t status;  // phase bit 0, SC 8:1, SCT 11:9, CRD 13:12, M 14, DNR 15
};
static_assert(sizeof(Cqe) == 16);

// Admin opcodes.
enum AdminOpcode : uint8_t {
  kAdminDeleteSq = 0x00,
  kAdminCreateSq = 0x01,
  kAdminGetLogPage = 0x02,
  kAdminDeleteCq = 0x04,
  kAdminCreateCq = 0x05,
  kAdminIdentify = 0x06,
  kAdminAbort = 0x08,
  kAdminSetFeatures = 0x09,
  kAdminGetFeatures = 0x0a,
  kAdminAsyncEvent = 0x0c,
  kAdminKeepAlive = 0x18,
};

// NVM command set opcodes.
enum NvmOpcode : uint8_t {
  kNvmFlush = 0x00,
  kNvmWrite = 0x01,
  kNvmRead = 0x02,
  kNvmWriteZeroes = 0x08,
  kNvmDsm = 0x09,
};

enum IdentifyCns : uint8_t {
  kCnsNamespace = 0x00,
  kCnsController = 0x01,
  kCnsActiveNsList = 0x02,
  kCnsNsDescriptors = 0x03,
  kCnsIoCommandSetController = 0x06,
};

enum FeatureId : uint8_t {
  kFeatArbitration = 0x01,
  kFeatPowerMgmt = 0x02,
  kFeatTempThreshold = 0x04,
  kFeatErrorRecovery = 0x05,
  kFeatVolatileWc = 0x06,
  kFeatNumQueues = 0x07,
  kFeatIntCoalescing = 0x08,
  kFeatIntVectorConfig = 0x09,
  kFeatWriteAtomicity = 0x0a,
  kFeatAsyncEventConfig = 0x0b,
  kFeatKeepAlive = 0x0f,
  kFeatHostBehavior = 0x16,
};

enum LogPageId : uint8_t {
  kLogError = 0x01,
  kLogDiscovery = 0x70,
  kLogSmart = 0x02,
  kLogFirmwareSlot = 0x03,
};

// Status = SCT << 8 | SC, as the CQE carries it (shifted left by one).
enum StatusType : uint16_t { kSctGeneric = 0, kSctCommandSpecific = 1, kSctMedia = 2 };
constexpr uint16_t make_status(uint16_t sct, uint16_t sc) {
  return static_cast<uint16_t>(sct << 8 | sc);
}
enum NvmeStatus : uint16_t {
  kSuccess = make_status(kSctGeneric, 0x00),
  kInvalidOpcode = make_status(kSctGeneric, 0x01),
  kInvalidField = make_status(kSctGeneric, 0x02),
  kDataTransferError = make_status(kSctGeneric, 0x04),
  kInternalError = make_status(kSctGeneric, 0x06),
  kAbortRequested = make_status(kSctGeneric, 0x07),
  kAbortSqDeleted = make_status(kSctGeneric, 0x08),
  kInvalidNamespace = make_status(kSctGeneric, 0x0b),
  kCommandSequenceError = make_status(kSctGeneric, 0x0c),
  kPrpOffsetInvalid = make_status(kSctGeneric, 0x13),
  kLbaOutOfRange = make_status(kSctGeneric, 0x80),
  kCqInvalid = make_status(kSctCommandSpecific, 0x00),
  kInvalidQueueId = make_status(kSctCommandSpecific, 0x01),
  kInvalidQueueSize = make_status(kSctCommandSpecific, 0x02),
  kAerLimitExceeded = make_status(kSctCommandSpecific, 0x05),
  kInvalidInterruptVector = make_status(kSctCommandSpecific, 0x08),
  kInvalidLogPage = make_status(kSctCommandSpecific, 0x09),
  kInvalidQueueDeletion = make_status(kSctCommandSpecific, 0x0c),
  kFeatureNotSaveable = make_status(kSctCommandSpecific, 0x0d),
  kUnrecoveredReadError = make_status(kSctMedia, 0x81),
  kWriteFault = make_status(kSctMedia, 0x80),
};
// The CQE status field of a status: SC in 8:1, SCT in 11:9, DNR for errors.
inline uint16_t cqe_status(uint16_t status, bool phase) {
  uint16_t s = static_cast<uint16_t>(status << 1) | (phase ? 1 : 0);
  if (status != kSuccess) s |= 1u << 15;  // do not retry: no error here is transient
  return s;
}
inline uint16_t status_of_cqe(uint16_t field) {
  return (field >> 1) & 0x7ff;
}

// Asynchronous event types and infos (completion dword 0 of an AER).
enum AsyncEventType : uint8_t { kAerError = 0, kAerSmart = 1, kAerNotice = 2 };
inline constexpr uint8_t kAerInfoInvalidDoorbell = 0x00;       // write to an invalid doorbell
inline constexpr uint8_t kAerInfoInvalidDoorbellValue = 0x01;  // invalid doorbell value
inline constexpr uint8_t kAerInfoTemperature = 0x01;           // SMART: temperature threshold
inline constexpr uint8_t kAerInfoDiscoveryChange = 0xf0;       // notice: discovery log changed

// A Read or Write of nlb (>= 1) blocks at lba: the one builder hosts use.
inline Sqe rw_command(uint16_t cid, bool write, uint32_t nsid, uint64_t lba, uint32_t nlb) {
  Sqe cmd{};
  cmd.opc = write ? kNvmWrite : kNvmRead;
  cmd.cid = cid;
  cmd.nsid = nsid;
  cmd.cdw10 = static_cast<uint32_t>(lba);
  cmd.cdw11 = static_cast<uint32_t>(lba >> 32);
  cmd.cdw12 = nlb - 1;
  return cmd;
}

inline constexpr uint32_t kIdentifySize = 4096;
inline constexpr uint32_t kNsidAll = 0xffffffffu;

// Little-endian fields of data structures (identify, logs, config space, registers).
inline void put16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}
inline void put32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
inline void put64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
// ASCII fields are space padded, not NUL terminated.
inline void put_ascii(uint8_t* p, size_t n, std::string_view s) {
  std::memset(p, ' ', n);
  std::memcpy(p, s.data(), std::min(n, s.size()));
}

}  // namespace dpukv::nvme
