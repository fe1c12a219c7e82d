// Blocks stored encoded by a KV codec (`dpukv replay --kv-codec`), as a connector
// with kv_codec stores them: each block is KV-like bf16 values that are a function
// of its id (kv_synth's realistic generator: per-channel scales, outlier channels,
// values correlated along tokens), in slabs of [128 tokens, 16 channels], encoded
// into a slot of the codec's largest encoding. The agent's memory stays what
// --capacity-blocks unencoded blocks take, so a codec's smaller blocks are more of
// them in the same memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engines/compress/kv_codec.h"
#include "runtime/status.h"

namespace dpukv::replay {

// "none" (false) or a codec of connector/codec.py's names: lossless, int8, int4.
bool kv_codec_from_name(const std::string& name, KvCodec* out);

// One client thread's encoder and checker (scratch memory sized once).
class BlockCodec {
 public:
  BlockCodec(KvCodec codec, uint64_t block);
  // The largest encoded block, rounded up to 4 KiB: a staging slot.
  uint64_t slot() const { return slot_; }
  // Block id, encoded, into dst (slot() bytes); its length in *len.
  Status encode(uint64_t id, uint8_t* dst, uint64_t* len);
  // Whether p (slot() bytes) holds block id as encode() writes it, and it decodes.
  bool check(uint64_t id, const uint8_t* p);

 private:
  KvCodecParams params_;
  uint64_t block_, slot_;
  KvScratch scratch_;
  std::vector<uint16_t> plain_;
  std::vector<uint8_t> expect_, decoded_;
};

}  // namespace dpukv::replay
