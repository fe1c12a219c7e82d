#include "comch/wire.h"

#include <cstring>

namespace dpukv::comch {

Status parse_header(const uint8_t* rec, size_t received, uint32_t max_msg, uint32_t expect_seq,
                    MsgHeader* hdr) {
  if (received < sizeof(MsgHeader)) return Code::kInvalidValue;
  std::memcpy(hdr, rec, sizeof(MsgHeader));
  if (hdr->magic != kMagic || hdr->version != kVersion) return Code::kInvalidValue;
  if (hdr->length != received - sizeof(MsgHeader)) return Code::kInvalidValue;
  if (hdr->seq != expect_seq) return Code::kInvalidValue;
  switch (static_cast<MsgType>(hdr->type)) {
    case MsgType::kHello:
      return hdr->length == sizeof(HelloPayload) ? Status() : Status(Code::kInvalidValue);
    case MsgType::kHelloAck:
      return hdr->length == sizeof(HelloAckPayload) ? Status() : Status(Code::kInvalidValue);
    case MsgType::kData:
      return hdr->length <= max_msg ? Status() : Status(Code::kTooBig);
    case MsgType::kExport:
      return hdr->length == sizeof(ExportPayload) ? Status() : Status(Code::kInvalidValue);
    case MsgType::kHeartbeat:
    case MsgType::kBye:
      return hdr->length == 0 ? Status() : Status(Code::kInvalidValue);
    case MsgType::kConsumerNew:
      return hdr->length == sizeof(ConsumerNewPayload) ? Status() : Status(Code::kInvalidValue);
    case MsgType::kConsumerExpired:
      return hdr->length == sizeof(ConsumerExpiredPayload) ? Status() : Status(Code::kInvalidValue);
  }
  return Code::kInvalidValue;
}

int fds_for_type(MsgType t) {
  switch (t) {
    case MsgType::kExport:
      return 1;
    case MsgType::kConsumerNew:
      return 2;
    default:
      return 0;
  }
}

const char* msg_type_name(uint16_t t) {
  switch (static_cast<MsgType>(t)) {
    case MsgType::kHello:
      return "HELLO";
    case MsgType::kHelloAck:
      return "HELLO_ACK";
    case MsgType::kData:
      return "DATA";
    case MsgType::kExport:
      return "EXPORT";
    case MsgType::kHeartbeat:
      return "HEARTBEAT";
    case MsgType::kBye:
      return "BYE";
    case MsgType::kConsumerNew:
      return "CONSUMER_NEW";
    case MsgType::kConsumerExpired:
      return "CONSUMER_EXPIRED";
  }
  return "UNKNOWN";
}

}  // namespace dpukv::comch
