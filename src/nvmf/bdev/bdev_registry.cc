#include "nvmf/bdev/bdev_registry.h"

#include <filesystem>

#include "nvmf/bdev/bdev_file.h"
#include "nvmf/bdev/bdev_kv.h"
#include "nvmf/bdev/bdev_malloc.h"

namespace dpukv::nvme {
namespace {

constexpr uint64_t kMaxBlocks = uint64_t{1} << 40;

uint32_t block_size_param(rpc::Params& p, uint64_t dflt) {
  const uint64_t bs = p.num("block_size", dflt, false, 512, 4096);
  if (p.ok() && !valid_block_size(static_cast<uint32_t>(bs)))
    p.fail("block_size must be 512 or 4096");
  return static_cast<uint32_t>(bs);
}

Status make_malloc(rpc::Params& p, const BdevLimits& lim, const std::string& name,
                   std::unique_ptr<Bdev>* out) {
  const uint64_t blocks = p.num("num_blocks", 0, true, 1, kMaxBlocks);
  const uint32_t bs = block_size_param(p, 512);
  if (p.ok() && blocks * bs > lim.max_memory_bytes)
    p.fail("num_blocks * block_size is larger than the malloc limit of " +
           std::to_string(lim.max_memory_bytes) + " bytes");
  if (!p.ok()) return Code::kInvalidValue;
  return create_malloc_bdev(name, blocks, bs, out);
}

Status make_null(rpc::Params& p, const BdevLimits&, const std::string& name,
                 std::unique_ptr<Bdev>* out) {
  const uint64_t blocks = p.num("num_blocks", 0, true, 1, kMaxBlocks);
  const uint32_t bs = block_size_param(p, 512);
  if (!p.ok()) return Code::kInvalidValue;
  return create_null_bdev(name, blocks, bs, out);
}

Status make_file(rpc::Params& p, const BdevLimits&, const std::string& name,
                 std::unique_ptr<Bdev>* out) {
  const std::string file = p.str("filename", "", true);
  const uint32_t bs = block_size_param(p, 4096);
  const uint64_t size = p.num("size", 0, false, 0, uint64_t{1} << 44);
  if (p.ok() && size == 0 && !std::filesystem::exists(file))
    p.fail("filename does not exist; give size to create it");
  if (!p.ok()) return Code::kInvalidValue;
  return create_file_bdev(name, file, size, bs, out);
}

Status make_kv(rpc::Params& p, const BdevLimits& lim, const std::string& name,
               std::unique_ptr<Bdev>* out) {
  KvBdevOptions o;
  o.num_blocks = p.num("num_blocks", 0, true, 1, kMaxBlocks);
  o.block_size = block_size_param(p, 4096);
  o.chunk_bytes = static_cast<uint32_t>(p.num("chunk_size", 64 * 1024, false, 4096, 4u << 20));
  o.memory_bytes = p.num("memory_size", 64ull << 20, false, 4096, uint64_t{1} << 40);
  o.disk_dir = p.str("disk_dir");
  o.disk_bytes = p.num("disk_size", 0, false, 0, uint64_t{1} << 44);
  if (p.ok() && (o.chunk_bytes % o.block_size != 0 || (o.chunk_bytes & (o.chunk_bytes - 1)) != 0))
    p.fail("chunk_size must be a power of two and a multiple of block_size");
  if (p.ok() && o.memory_bytes > lim.max_memory_bytes)
    p.fail("memory_size is larger than the memory limit");
  if (p.ok() && o.memory_bytes < o.chunk_bytes) p.fail("memory_size must hold at least one chunk");
  if (p.ok() && o.disk_dir.empty() != (o.disk_bytes == 0))
    p.fail("disk_dir and disk_size go together");
  if (!p.ok()) return Code::kInvalidValue;
  return create_kv_bdev(name, o, out);
}

}  // namespace

const std::vector<BdevKind>& bdev_kinds() {
  static const std::vector<BdevKind> kinds = {
      {"malloc", {"name", "num_blocks", "block_size", "uuid"}, "Malloc", &make_malloc},
      {"null", {"name", "num_blocks", "block_size", "uuid"}, nullptr, &make_null},
      {"file", {"name", "filename", "block_size", "size"}, nullptr, &make_file},
      {"kv",
       {"name", "num_blocks", "block_size", "chunk_size", "memory_size", "disk_dir", "disk_size"},
       nullptr,
       &make_kv},
  };
  return kinds;
}

const BdevKind* find_bdev_kind(const std::string& kind) {
  for (const BdevKind& k : bdev_kinds())
    if (kind == k.kind) return &k;
  return nullptr;
}

std::string bdev_kind_names() {
  std::string s;
  for (const BdevKind& k : bdev_kinds()) s += (s.empty() ? "" : ", ") + std::string(k.kind);
  return s;
}

}  // namespace dpukv::nvme
