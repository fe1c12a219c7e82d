#include "tools/replay/codec.h"

#include <cstring>

#include "engines/compress/kv_synth.h"

namespace dpukv::replay {
namespace {
constexpr uint32_t kTokens = 128, kChannels = 16;  // a slab: 4 KiB of bf16
}  // namespace

bool kv_codec_from_name(const std::string& name, KvCodec* out) {
  if (name == "lossless")
    *out = KvCodec::kLosslessDelta;
  else if (name == "int8")
    *out = KvCodec::kInt8;
  else if (name == "int4")
    *out = KvCodec::kInt4;
  else
    return false;
  return true;
}

BlockCodec::BlockCodec(KvCodec codec, uint64_t block)
    : block_(block), scratch_(block), expect_(0), decoded_(block) {
  // Blocks are whole 4 KiB pages: whole slabs.
  params_.codec = codec;
  params_.dtype = KvDtype::kBf16;
  params_.shape = {static_cast<uint32_t>(block / (2 * kTokens * kChannels)), kTokens, kChannels};
  slot_ = (kv_encode_bound(params_, block) + 4095) / 4096 * 4096;
  expect_.resize(slot_);
}

Status BlockCodec::encode(uint64_t id, uint8_t* dst, uint64_t* len) {
  kv_synth(KvDataset::kRealistic, KvDtype::kBf16, params_.shape, id + 1, &plain_);
  size_t n = 0;
  DPUKV_RETURN_IF_ERROR(kv_encode(params_, reinterpret_cast<const uint8_t*>(plain_.data()), block_,
                                  dst, slot_, &scratch_, &n, nullptr));
  *len = n;
  return Code::kSuccess;
}

bool BlockCodec::check(uint64_t id, const uint8_t* p) {
  size_t len = 0, want = 0, out = 0;
  uint64_t n = 0;
  if (!kv_encoded_length(p, slot_, &len).ok() || !encode(id, expect_.data(), &n).ok()) return false;
  want = n;
  return len == want && std::memcmp(p, expect_.data(), len) == 0 &&
         kv_decode(p, len, decoded_.data(), decoded_.size(), &scratch_, &out).ok() && out == block_;
}

}  // namespace dpukv::replay
