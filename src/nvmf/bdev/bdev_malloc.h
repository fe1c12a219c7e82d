// RAM and null block devices: complete inside submit(), no threads, no locks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nvmf/bdev/bdev.h"

namespace dpukv::nvme {

// RAM: pre-faulted private memory, zero-filled.
Status create_malloc_bdev(const std::string& name, uint64_t num_blocks, uint32_t block_size,
                          std::unique_ptr<Bdev>* out);
// Null: reads return zeroes, writes are dropped; measures the path without a medium.
Status create_null_bdev(const std::string& name, uint64_t num_blocks, uint32_t block_size,
                        std::unique_ptr<Bdev>* out);

}  // namespace dpukv::nvme
