// File block device: io_uring, O_DIRECT where the file system has it; data moves
// through aligned bounce buffers, and poll() rings io_uring once for every
// command submit() prepared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nvmf/bdev/bdev.h"

namespace dpukv::nvme {

// File: io_uring with O_DIRECT where the file system allows it (buffered otherwise,
// logged). size_bytes 0 uses the file's size; a larger size extends the file.
Status create_file_bdev(const std::string& name, const std::string& path, uint64_t size_bytes,
                        uint32_t block_size, std::unique_ptr<Bdev>* out);

}  // namespace dpukv::nvme
