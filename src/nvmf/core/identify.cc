#include "nvmf/core/identify.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "nvme/nvme_spec.h"

namespace dpukv::nvme {
namespace {

// Fields a discovery controller and an I/O controller fill alike.
void common_fields(const ControllerConfig& c, const IdentifyLimits& l, uint8_t* d) {
  put16(d + 0, c.vendor_id);  // VID
  put16(d + 2, c.vendor_id);  // SSVID
  put_ascii(d + 4, 20, c.serial);
  put_ascii(d + 24, 40, c.model);
  put_ascii(d + 64, 8, c.firmware);
  d[77] = c.mdts;
  put16(d + 78, c.cntlid);
  put32(d + 80, 0x00010400);  // VER 1.4
  d[259] = static_cast<uint8_t>(l.aer_limit - 1);
  d[261] = 0x04;  // LPA: extended Get Log Page offsets
  d[262] = static_cast<uint8_t>(l.error_log_entries - 1);
  put16(d + 320, 10);  // KAS: 100 ms units
  std::memcpy(d + 768, c.subnqn.data(), std::min<size_t>(c.subnqn.size(), 255));
}

void discovery_controller(const ControllerConfig& c, const IdentifyLimits& l, uint8_t* d) {
  common_fields(c, l, d);
  put32(d + 92, 1u << 31);                             // OAES: discovery log page change notices
  put32(d + 96, 1u << 6);                              // CTRATT: traffic-based keep alive
  d[111] = 2;                                          // CNTRLTYPE: discovery controller
  put16(d + 514, static_cast<uint16_t>(c.mqes + 1u));  // MAXCMD
  put32(d + 536, 1u | 1u << 20);                       // SGLs; offsets in data blocks
  d[1803] = 1;                                         // MSDBD
}

}  // namespace

void identify_controller(const ControllerConfig& c, const IdentifyLimits& l, uint8_t* d) {
  if (c.discovery) return discovery_controller(c, l, d);
  common_fields(c, l, d);
  d[72] = 6;   // RAB
  d[111] = 1;  // CNTRLTYPE: I/O controller
  d[258] = static_cast<uint8_t>(l.abort_limit - 1);
  d[260] = 0x03;        // FRMW: one slot, read-only
  put16(d + 266, 343);  // WCTEMP
  put16(d + 268, 373);  // CCTEMP
  // CTRATT TBKAS: any command on any queue restarts the keep-alive timer.
  if (c.fabrics) put32(d + 96, 1u << 6);
  d[512] = 0x66;                                                      // SQES: 64 bytes
  d[513] = 0x44;                                                      // CQES: 16 bytes
  if (c.fabrics) put16(d + 514, static_cast<uint16_t>(c.mqes + 1u));  // MAXCMD
  put32(d + 516, l.max_namespaces);
  put16(d + 520, 0x1c);                          // ONCS: DSM, Write Zeroes, Save/Select in features
  d[525] = 0x07;                                 // VWC present; flush with NSID all supported
  if (c.fabrics) put32(d + 536, 1u | 1u << 20);  // SGLs; offsets in data blocks
  if (c.fabrics) {
    put32(d + 1792, (64 + c.in_capsule_bytes) / 16);  // IOCCSZ
    put32(d + 1796, 1);                               // IORCSZ
    put16(d + 1800, 0);                               // ICDOFF
    d[1802] = 0;                                      // FCATT: dynamic controllers
    d[1803] = 1;                                      // MSDBD
  }
  put16(d + 2048, 2500);  // PSD0 max power: 25 W
}

void namespace_nguid(std::string_view serial, uint32_t nsid, uint8_t* out) {
  uint64_t h = 0x6470756b766e7630ull ^ (uint64_t{nsid} * 0x9e3779b97f4a7c15ull);
  for (char ch : serial) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  put64(out, h);
  put64(out + 8, h * 0x9e3779b97f4a7c15ull + nsid);
}

void identify_namespace(uint64_t num_blocks, uint32_t block_size, const uint8_t* nguid,
                        uint8_t* d) {
  put64(d + 0, num_blocks);   // NSZE
  put64(d + 8, num_blocks);   // NCAP
  put64(d + 16, num_blocks);  // NUSE
  d[25] = 0;                  // NLBAF: one format
  d[26] = 0;                  // FLBAS
  d[33] = 0x09;               // DLFEAT: deallocated blocks read zero; Write Zeroes may deallocate
  std::memcpy(d + 104, nguid, 16);
  d[128 + 2] = static_cast<uint8_t>(std::countr_zero(block_size));  // LBAF0.LBADS
}

void namespace_descriptors(const uint8_t* nguid, uint8_t* d) {
  d[0] = 2;  // NIDT: NGUID
  d[1] = 16;
  std::memcpy(d + 4, nguid, 16);
}

}  // namespace dpukv::nvme
