// Every kind of block device, created from named parameters (a JSON object) in
// one way: the JSON-RPC method bdev_<kind>_create and the command line
// (`dpukv nvme target --bdev KIND`) both go through the kind's constructor, so a
// parameter is checked once and means the same on both paths. A new kind is one
// entry in bdev_registry.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nvmf/bdev/bdev.h"
#include "rpc/params.h"

namespace dpukv::nvme {

struct BdevLimits {
  uint64_t max_memory_bytes = 0;  // for a malloc bdev, or a kv bdev's memory tier
};

struct BdevKind {
  const char* kind;                 // "malloc": method bdev_malloc_create
  std::vector<const char*> params;  // what the method accepts (others are refused)
  const char* default_name;         // prefix numbered when "name" is absent; null: required
  // Reads the parameters (a problem is left in p and INVALID_VALUE returned) and
  // creates the device.
  Status (*create)(rpc::Params& p, const BdevLimits& limits, const std::string& name,
                   std::unique_ptr<Bdev>* out);
};

const std::vector<BdevKind>& bdev_kinds();
const BdevKind* find_bdev_kind(const std::string& kind);  // null if unknown
// "malloc, null, file, kv": for help texts and errors.
std::string bdev_kind_names();

}  // namespace dpukv::nvme
