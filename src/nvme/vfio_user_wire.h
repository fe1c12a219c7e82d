// vfio-user protocol messages (libvfio-user docs/vfio-user.rst, version 0.1; the
// same text is QEMU's docs/interop/vfio-user.rst). Host-endian, packed as the
// specification lays them out; every struct below is checked against its size.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpukv::vfio_user {

inline constexpr uint16_t kVersionMajor = 0;
inline constexpr uint16_t kVersionMinor = 1;
// Largest message we accept: a REGION_WRITE of max_data_xfer_size plus headers.
inline constexpr uint32_t kMaxDataXfer = 1u << 20;
inline constexpr uint32_t kMaxMessage = kMaxDataXfer + 64;
inline constexpr int kMaxMsgFds = 16;

enum Command : uint16_t {
  kVersion = 1,
  kDmaMap = 2,
  kDmaUnmap = 3,
  kDeviceGetInfo = 4,
  kDeviceGetRegionInfo = 5,
  kDeviceGetRegionIoFds = 6,
  kDeviceGetIrqInfo = 7,
  kDeviceSetIrqs = 8,
  kRegionRead = 9,
  kRegionWrite = 10,
  kDmaRead = 11,
  kDmaWrite = 12,
  kDeviceReset = 13,
  kRegionWriteMulti = 15,
  kDeviceFeature = 16,
};

inline constexpr uint32_t kFlagTypeMask = 0xf;
inline constexpr uint32_t kFlagCommand = 0, kFlagReply = 1;
inline constexpr uint32_t kFlagNoReply = 1u << 4;
inline constexpr uint32_t kFlagError = 1u << 5;

struct Header {
  uint16_t msg_id;
  uint16_t command;
  uint32_t msg_size;  // including this header
  uint32_t flags;
  uint32_t error_no;
};
static_assert(sizeof(Header) == 16);

struct Version {
  uint16_t major, minor;
  // followed by optional NUL-terminated JSON
};

inline constexpr uint32_t kDmaRead_ = 1, kDmaWrite_ = 2;
struct DmaMap {
  uint32_t argsz, flags;
  uint64_t offset, addr, size;
};
static_assert(sizeof(DmaMap) == 32);

inline constexpr uint32_t kDmaUnmapAll = 1u << 1;
struct DmaUnmap {
  uint32_t argsz, flags;
  uint64_t addr, size;
};
static_assert(sizeof(DmaUnmap) == 24);

inline constexpr uint32_t kDeviceFlagsReset = 1u << 0, kDeviceFlagsPci = 1u << 1;
struct DeviceInfo {
  uint32_t argsz, flags, num_regions, num_irqs;
};
static_assert(sizeof(DeviceInfo) == 16);

// PCI region indices of vfio (linux/vfio.h).
enum RegionIndex : uint32_t {
  kBar0 = 0,
  kBar5 = 5,
  kRom = 6,
  kConfig = 7,
  kVga = 8,
  kNumRegions = 9,
};
inline constexpr uint32_t kRegionRead_ = 1, kRegionWrite_ = 2, kRegionMmap = 4, kRegionCaps = 8;
struct RegionInfo {
  uint32_t argsz, flags, index, cap_offset;
  uint64_t size, offset;
};
static_assert(sizeof(RegionInfo) == 32);
inline constexpr uint16_t kCapSparseMmap = 1;
struct CapHeader {
  uint16_t id, version;
  uint32_t next;
};
struct SparseMmap {
  CapHeader header;
  uint32_t nr_areas, reserved;
  uint64_t offset, size;  // one area
};
static_assert(sizeof(SparseMmap) == 32);

enum IrqIndex : uint32_t {
  kIrqIntx = 0,
  kIrqMsi = 1,
  kIrqMsix = 2,
  kIrqErr = 3,
  kIrqReq = 4,
  kNumIrqs = 5
};
inline constexpr uint32_t kIrqInfoEventfd = 1, kIrqInfoMaskable = 2, kIrqInfoAutomasked = 4,
                          kIrqInfoNoresize = 8;
struct IrqInfo {
  uint32_t argsz, flags, index, count;
};
static_assert(sizeof(IrqInfo) == 16);

inline constexpr uint32_t kIrqDataNone = 1, kIrqDataBool = 2, kIrqDataEventfd = 4;
inline constexpr uint32_t kIrqActionMask = 8, kIrqActionUnmask = 16, kIrqActionTrigger = 32;
struct IrqSet {
  uint32_t argsz, flags, index, start, count;
};
static_assert(sizeof(IrqSet) == 20);

struct RegionAccess {
  uint64_t offset;
  uint32_t region, count;
};
static_assert(sizeof(RegionAccess) == 16);

}  // namespace dpukv::vfio_user
