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
    case MsgType::kRefused:
      return hdr->length == sizeof(RefusedPayload) ? Status() : Status(Code::kInvalidValue);
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
    case MsgType::kRefused:
      return "REFUSED";
  }
  return "UNKNOWN";
}

const char* refuse_reason_text(uint32_t reason) {
  switch (static_cast<RefuseReason>(reason)) {
    case RefuseReason::kFull:
      return "the agent is full: it holds its max_clients connections (close idle clients, or "
             "raise max_clients)";
    case RefuseReason::kPeerLimit:
      return "this user holds its share of the agent's connections (max_clients_per_uid); close "
             "idle clients of this user, or raise the setting";
    case RefuseReason::kFdLimit:
      return "the agent is out of file descriptors (raise LimitNOFILE in its unit, or ulimit -n)";
    case RefuseReason::kNotAllowed:
      return "this user is not let in by the agent (its tenants: no rule names this user, and "
             "tenant_by is refuse; or its allow-list of uids)";
    case RefuseReason::kBadHello:
      return "the agent refused this client's HELLO (a heartbeat above its bound, or a bad field)";
  }
  return "the agent refused the connection (reason unknown to this client)";
}

}  // namespace dpukv::comch
