// The Identify data structures the controller core reports (NVMe Base 2.0,
// 5.17.2; NVMe over Fabrics 1.1 for the fabrics and discovery fields), each built
// into a zeroed kIdentifySize page from what describes the controller or the
// namespace: pure functions, no controller state, so each field can be checked
// against the specification's offsets alone.
#pragma once

#include <cstdint>
#include <string_view>

#include "nvmf/core/controller_config.h"

namespace dpukv::nvme {

// The controller's limits that Identify Controller reports.
struct IdentifyLimits {
  uint32_t abort_limit = 4;        // ACL + 1
  uint32_t aer_limit = 4;          // AERL + 1
  uint32_t error_log_entries = 8;  // ELPE + 1
  uint32_t max_namespaces = 32;    // NN
};

// CNS 01h of an I/O controller, or (c.discovery) of a discovery controller: no
// namespaces, no I/O command set, CNTRLTYPE 2, discovery log change notices.
void identify_controller(const ControllerConfig& c, const IdentifyLimits& l, uint8_t* page);

// A namespace's NGUID: stable for a serial number and NSID, different across them.
void namespace_nguid(std::string_view serial, uint32_t nsid, uint8_t* out16);
// CNS 00h of an active namespace of num_blocks blocks of block_size bytes (a power
// of two), one LBA format.
void identify_namespace(uint64_t num_blocks, uint32_t block_size, const uint8_t* nguid16,
                        uint8_t* page);
// CNS 03h: one descriptor, the NGUID that Identify Namespace reports.
void namespace_descriptors(const uint8_t* nguid16, uint8_t* page);

}  // namespace dpukv::nvme
