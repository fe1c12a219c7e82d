// Wire format of the control channel. Every message is one SOCK_SEQPACKET record:
// a 16-byte header, then `length` bytes of payload. Documented in docs/protocols.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/mmap.h"
#include "runtime/status.h"

namespace dpukv::comch {

inline constexpr uint32_t kMagic = 0x48434b44;  // "DKCH"
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kDefaultMaxMsg = 4080;  // BlueField comch default
inline constexpr uint32_t kMaxMsgLimit = 65536;

enum class MsgType : uint16_t {
  kHello = 1,            // client → server, first message
  kHelloAck = 2,         // server → client
  kData = 3,             // user message
  kExport = 4,           // memory export: ExportPayload + 1 fd (the memfd)
  kHeartbeat = 5,        // empty
  kBye = 6,              // orderly close
  kConsumerNew = 7,      // fast path: ConsumerNewPayload + 2 fds (ring memfd, doorbell eventfd)
  kConsumerExpired = 8,  // fast path: ConsumerExpiredPayload
  kRefused = 9,          // server → client, instead of HELLO_ACK: RefusedPayload, then close
};

// Why a server refused a connection: the client reports it instead of a bare reset.
enum class RefuseReason : uint32_t {
  kFull = 1,        // the server holds max_connections
  kPeerLimit = 2,   // this uid holds its share (max_connections_per_uid)
  kFdLimit = 3,     // the server is out of file descriptors
  kNotAllowed = 4,  // no tenant for this peer, or a uid outside the server's allow-list
  kBadHello = 5,    // the HELLO asked for what the server does not allow
};

struct RefusedPayload {
  uint32_t reason;  // RefuseReason
  uint32_t limit;   // the limit that was reached (connections, or the heartbeat bound in ms)
  uint64_t reserved;
};
static_assert(sizeof(RefusedPayload) == 16);

// The words a client prints for a refusal: what happened and what to do.
const char* refuse_reason_text(uint32_t reason);

struct MsgHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t length;  // payload bytes after the header
  uint32_t seq;     // per direction, from 0, +1 per message
};
static_assert(sizeof(MsgHeader) == 16);

struct HelloPayload {
  uint32_t max_msg;       // largest user payload the client will send or accept
  uint32_t heartbeat_ms;  // client's heartbeat interval
  uint64_t reserved;      // 0
};
static_assert(sizeof(HelloPayload) == 16);

struct HelloAckPayload {
  uint64_t connection_id;
  uint32_t max_msg;  // negotiated: min of both sides
  uint32_t heartbeat_ms;
};
static_assert(sizeof(HelloAckPayload) == 16);

struct ExportPayload {
  ExportDescriptor desc;
  uint64_t cookie;  // exporter's tag, handed to the importer's callback
};
static_assert(sizeof(ExportPayload) == 48);

struct ConsumerNewPayload {
  uint64_t consumer_id;
  uint64_t data_map_id;   // the exporter's id of the map receive buffers are posted from
  ExportDescriptor ring;  // the ring region (its fd is the first passed fd)
};
static_assert(sizeof(ConsumerNewPayload) == 56);

struct ConsumerExpiredPayload {
  uint64_t consumer_id;
};

// Checks a received record of `received` bytes: magic, version, known type, the
// length field matching the record, payload bound (max_msg for DATA; the fixed
// size for control types) and the sequence number. On success *hdr holds the
// header. Every failure is INVALID_VALUE except a payload above max_msg (TOO_BIG).
Status parse_header(const uint8_t* rec, size_t received, uint32_t max_msg, uint32_t expect_seq,
                    MsgHeader* hdr);

// Fds each type must carry (0 for most).
int fds_for_type(MsgType t);

const char* msg_type_name(uint16_t t);

}  // namespace dpukv::comch
