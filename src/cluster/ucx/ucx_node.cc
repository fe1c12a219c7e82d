#include "cluster/ucx/ucx_node.h"

#include <dirent.h>
#include <sys/epoll.h>
#include <sys/random.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/log.h"

namespace dpukv {
namespace {

constexpr uint32_t kDescMagic = 0x50564b44;  // "DKVP"
constexpr uint16_t kDescVersion = 1;
constexpr uint32_t kMaxBlobField = 64 * 1024;
constexpr uint32_t kAmControl = 1;
constexpr uint32_t kAmMagic = 0x43564b44;  // "DKVC"

struct DescHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint64_t node_id;
  uint64_t region_base;
  uint64_t region_len;
  uint32_t address_len;
  uint32_t rkey_len;
};
static_assert(sizeof(DescHeader) == 40, "a description header travels between hosts");

struct AmHeader {
  uint32_t magic;
  uint32_t length;  // of the payload
  uint64_t sender;  // node id
};
static_assert(sizeof(AmHeader) == 16, "an active message header travels between hosts");

bool has_rdma_device() {
  DIR* d = opendir("/sys/class/infiniband");
  if (d == nullptr) return false;
  bool any = false;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') any = true;
  closedir(d);
  return any;
}

// Whether the context has a UD transport (the wireup path that UCX < 1.14 cannot
// purge), read off the resource list UCX prints ("-- ud_verbs/rxe0:1").
bool has_ud_transport(ucp_context_h ctx) {
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == nullptr) return true;  // cannot tell: the careful answer
  ucp_context_print_info(ctx, f);
  std::fclose(f);
  const bool ud = text != nullptr && std::strstr(text, "-- ud_") != nullptr;
  std::free(text);
  return ud;
}

}  // namespace

struct UcxNode::Peer {
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  PeerDescription desc;
  bool ok = false;
  bool answered = false;  // a message came from it: its connection was made
  UcxNode* owner = nullptr;
  void* close_req = nullptr;
};

struct UcxNode::ReadSlot {
  UcxNode* owner = nullptr;
  Peer* peer = nullptr;  // lives until its close ends (or the process, if never answered)
  DoneCb cb = nullptr;
  void* arg = nullptr;
  uint64_t len = 0;
};

struct UcxNode::SendSlot {
  UcxNode* owner = nullptr;
  AmHeader header{};
  std::vector<uint8_t> payload;  // held until the send completes (UCX 1.13)
  bool done = false;
};

Status parse_peer_description(const uint8_t* blob, size_t len, PeerDescription* out) {
  DescHeader h;
  if (blob == nullptr || len < sizeof(h)) return Code::kInvalidValue;
  std::memcpy(&h, blob, sizeof(h));
  if (h.magic != kDescMagic || h.version != kDescVersion || h.address_len == 0 ||
      h.address_len > kMaxBlobField || h.rkey_len == 0 || h.rkey_len > kMaxBlobField ||
      len != sizeof(h) + h.address_len + h.rkey_len || h.region_len == 0 ||
      h.region_base + h.region_len < h.region_base)
    return Code::kInvalidValue;
  out->node_id = h.node_id;
  out->region_base = h.region_base;
  out->region_len = h.region_len;
  const auto* p = reinterpret_cast<const char*>(blob + sizeof(h));
  out->worker_address.assign(p, h.address_len);
  out->rkey.assign(p + h.address_len, h.rkey_len);
  return Code::kSuccess;
}

UcxNode::UcxNode(ProgressEngine* pe, const UcxNodeOptions& o) : Context(pe), opts_(o) {
  efd_watch_.owner = this;
}

void UcxNode::set_transport_defaults() {
  // UCX 1.13 connects TCP endpoints with a blocking connect(): to a partitioned
  // peer that held the agent's only thread for seconds (ARP timing out). Unless the
  // user chose otherwise, connect without blocking. (The transports read this from
  // the environment when they open; ucp_config_modify does not reach them.)
  (void)setenv("UCX_TCP_CONN_NB", "y", 0);
  // UCX's TCP transport moves data in segments of TX_SEG_SIZE (8 KiB by default):
  // a 32 MiB one-sided read then ran at 0.41x a raw TCP stream on loopback and
  // 0.46x between two network namespaces. 256 KiB out, 512 KiB in: 1.24x and
  // 2.0x, and a prefill-to-decode push 3.3x faster (bench cluster). Unless the
  // user chose otherwise.
  (void)setenv("UCX_TCP_TX_SEG_SIZE", "256k", 0);
  (void)setenv("UCX_TCP_RX_SEG_SIZE", "512k", 0);
}

std::string UcxNode::settings() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  auto env = [](const char* k) {
    const char* v = getenv(k);
    return std::string(v != nullptr ? v : "default");
  };
  return "UCX " + std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(release) + ", UCX_TLS=" + env("UCX_TLS") +
         ", UCX_TCP_TX_SEG_SIZE=" + env("UCX_TCP_TX_SEG_SIZE") +
         ", UCX_TCP_RX_SEG_SIZE=" + env("UCX_TCP_RX_SEG_SIZE");
}

Status UcxNode::create(ProgressEngine* pe, const UcxNodeOptions& o, std::unique_ptr<UcxNode>* out) {
  if (o.max_reads == 0 || o.max_peers == 0) return Code::kInvalidValue;
  std::unique_ptr<UcxNode> n(new UcxNode(pe, o));
  DPUKV_RETURN_IF_ERROR(n->init());
  *out = std::move(n);
  return Code::kSuccess;
}

Status UcxNode::init() {
  if (getrandom(&node_id_, sizeof(node_id_), 0) != sizeof(node_id_)) return Code::kDriver;
  ucp_config_t* cfg = nullptr;
  set_transport_defaults();
  // UCX before 1.14 aborts (an assertion in ucp_request_send_state_ff; removed by
  // openucx/ucx#8175) when it purges an endpoint whose wireup request to a peer that
  // never answered still waits on a UD endpoint: when we close it, and when UD gives
  // up on the peer (UCX_UD_TIMEOUT, 30 s). Seen with Soft-RoCE: a holder killed
  // after it was listed and before a reader reached it took the reader down. On
  // those versions such endpoints stay open until the process ends, and UD waits a
  // day before it gives up, unless the user set UCX_UD_TIMEOUT.
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  const bool old_ucx = major == 1 && minor < 14;
  // Only where there is an RDMA device: UCX warns on stdout about a setting nothing
  // reads.
  if (old_ucx && has_rdma_device()) (void)setenv("UCX_UD_TIMEOUT", "86400s", 0);
  if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return Code::kDriver;
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  const ucs_status_t st = ucp_init(&p, cfg, &ctx_);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    LOG_ERR("cluster: ucp_init failed: %s", ucs_status_string(st));
    return Code::kDriver;
  }
  purge_aborts_ = old_ucx && has_ud_transport(ctx_);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_worker_create(ctx_, &wp, &worker_) != UCS_OK) return Code::kDriver;
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  if (ucp_worker_get_address(worker_, &addr, &addr_len) != UCS_OK) return Code::kDriver;
  address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) return Code::kDriver;
  reads_.resize(opts_.max_reads);
  for (ReadSlot& s : reads_) {
    s.owner = this;
    free_reads_.push_back(&s);
  }
  return Code::kSuccess;
}

UcxNode::~UcxNode() {
  while (!closing_.empty()) {
    ucp_worker_progress(worker_);
    reap_closed();
  }
  for (auto& p : peers_)
    if (p && p->ep != nullptr && !p->answered && purge_aborts_) unanswered_.push_back(std::move(p));
  for (auto& p : peers_)
    if (p && p->rkey != nullptr) ucp_rkey_destroy(p->rkey);
  for (auto& p : peers_)
    if (p && p->ep != nullptr && p->close_req == nullptr) {
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(p->ep, &prm);
      while (r != nullptr && UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS)
        ucp_worker_progress(worker_);
      if (r != nullptr && UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    }
  if (memh_ != nullptr) ucp_mem_unmap(ctx_, memh_);
  // Destroying the worker would purge the endpoints that must not be: left to exit.
  if (!unanswered_.empty()) return;
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (ctx_ != nullptr) ucp_cleanup(ctx_);
}

Status UcxNode::expose(void* base, uint64_t len) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  if (base == nullptr || len == 0 || memh_ != nullptr) return Code::kInvalidValue;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = len;
  if (ucp_mem_map(ctx_, &mp, &memh_) != UCS_OK) return Code::kDriver;
  void* rk = nullptr;
  size_t rk_len = 0;
  if (ucp_rkey_pack(ctx_, memh_, &rk, &rk_len) != UCS_OK) return Code::kDriver;
  rkey_.assign(static_cast<const char*>(rk), rk_len);
  ucp_rkey_buffer_release(rk);
  region_ = base;
  region_len_ = len;
  return Code::kSuccess;
}

Status UcxNode::description(std::string* blob) const {
  if (memh_ == nullptr) return Code::kBadState;
  DescHeader h{kDescMagic,
               kDescVersion,
               0,
               node_id_,
               reinterpret_cast<uint64_t>(region_),
               region_len_,
               static_cast<uint32_t>(address_.size()),
               static_cast<uint32_t>(rkey_.size())};
  blob->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  *blob += address_;
  *blob += rkey_;
  return Code::kSuccess;
}

Status UcxNode::do_start() {
  DPUKV_RETURN_IF_ERROR(pe()->watch_fd(efd_, EPOLLIN, &efd_watch_));
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kAmControl;
  hp.cb = &UcxNode::on_control;
  hp.arg = this;
  if (ucp_worker_set_am_recv_handler(worker_, &hp) != UCS_OK) {
    pe()->unwatch_fd(efd_, &efd_watch_);
    return Code::kDriver;
  }
  return Code::kSuccess;
}

void UcxNode::do_stop() {
  for (auto& p : peers_) {
    if (!p || p->ep == nullptr || p->close_req != nullptr) continue;
    if (p->rkey != nullptr) ucp_rkey_destroy(p->rkey), p->rkey = nullptr;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(p->ep, &prm);
    p->ok = false;
    p->close_req = r != nullptr && UCS_PTR_IS_PTR(r) ? r : reinterpret_cast<void*>(1);
  }
}

bool UcxNode::drained() {
  ucp_worker_progress(worker_);
  for (auto& p : peers_) {
    if (!p || p->close_req == nullptr || p->close_req == reinterpret_cast<void*>(1)) continue;
    if (ucp_request_check_status(p->close_req) == UCS_INPROGRESS) return false;
    ucp_request_free(p->close_req);
    p->close_req = reinterpret_cast<void*>(1);
  }
  reap_closed();
  if (inflight_ != 0 || !closing_.empty()) return false;
  for (auto& s : sends_)
    if (!s->done) return false;
  sends_.clear();
  for (auto& p : peers_)
    if (p) p->ep = nullptr;  // closed
  pe()->unwatch_fd(efd_, &efd_watch_);
  return true;
}

size_t UcxNode::poll() {
  size_t n = 0;
  for (int i = 0; i < 64; ++i) {
    const unsigned k = ucp_worker_progress(worker_);
    if (k == 0) break;
    n += k;
  }
  if (!closing_.empty()) reap_closed();
  // Control messages whose sends completed leave the list.
  for (size_t i = 0; i < sends_.size();) {
    if (sends_[i]->done) {
      sends_[i] = std::move(sends_.back());
      sends_.pop_back();
    } else {
      ++i;
    }
  }
  return n;
}

bool UcxNode::arm_notification() {
  return ucp_worker_arm(worker_) == UCS_ERR_BUSY;
}

void UcxNode::ep_failed(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* p = static_cast<Peer*>(arg);
  if (!p->ok) return;
  p->ok = false;
  ++p->owner->counters_.peers_failed;
  LOG_WARN("cluster: peer %016llx failed: %s", static_cast<unsigned long long>(p->desc.node_id),
           ucs_status_string(st));
}

Status UcxNode::connect(const uint8_t* blob, size_t len, uint32_t* peer) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  auto p = std::make_unique<Peer>();
  DPUKV_RETURN_IF_ERROR(parse_peer_description(blob, len, &p->desc));
  if (p->desc.node_id == node_id_) return Code::kInvalidValue;
  size_t slot = peers_.size();
  for (size_t i = 0; i < peers_.size(); ++i)
    if (!peers_[i]) {
      slot = i;
      break;
    }
  if (slot == peers_.size() && peers_.size() >= opts_.max_peers) return Code::kFull;
  p->owner = this;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  if (opts_.detect_peer_failure)
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(p->desc.worker_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxNode::ep_failed;
  ep.err_handler.arg = p.get();
  if (ucs_status_t s = ucp_ep_create(worker_, &ep, &p->ep); s != UCS_OK) {
    LOG_WARN("cluster: cannot reach node %016llx: ucp_ep_create: %s",
             static_cast<unsigned long long>(p->desc.node_id), ucs_status_string(s));
    return Code::kConnectionReset;
  }
  if (ucs_status_t s = ucp_ep_rkey_unpack(p->ep, p->desc.rkey.data(), &p->rkey); s != UCS_OK) {
    LOG_WARN("cluster: node %016llx: its memory key does not unpack: %s",
             static_cast<unsigned long long>(p->desc.node_id), ucs_status_string(s));
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(p->ep, &prm);
    if (r != nullptr && UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    ++counters_.bad_messages;
    return Code::kInvalidValue;
  }
  p->ok = true;
  if (slot == peers_.size())
    peers_.push_back(std::move(p));
  else
    peers_[slot] = std::move(p);
  *peer = static_cast<uint32_t>(slot);
  return Code::kSuccess;
}

bool UcxNode::peer_ok(uint32_t peer) const {
  return peer < peers_.size() && peers_[peer] && peers_[peer]->ok;
}

void UcxNode::disconnect(uint32_t peer) {
  if (peer >= peers_.size() || !peers_[peer]) return;
  std::unique_ptr<Peer> p = std::move(peers_[peer]);
  p->ok = false;
  if (p->ep != nullptr && !p->answered && purge_aborts_) {
    if (unanswered_.empty())
      LOG_WARN(
          "cluster: UCX %s cannot close an endpoint to a peer that never answered "
          "(fixed in UCX 1.14); such endpoints stay open until the agent exits",
          ucp_get_version_string());
    unanswered_.push_back(std::move(p));
    return;
  }
  if (p->ep != nullptr) {
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(p->ep, &prm);
    p->ep = nullptr;
    if (r != nullptr && UCS_PTR_IS_PTR(r)) {
      p->close_req = r;  // the rkey stays until the close (and its canceled reads) ends
      closing_.push_back(std::move(p));
      return;
    }
  }
  if (p->rkey != nullptr) ucp_rkey_destroy(p->rkey);
}

void UcxNode::reap_closed() {
  for (size_t i = 0; i < closing_.size();) {
    Peer* p = closing_[i].get();
    if (ucp_request_check_status(p->close_req) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(p->close_req);
    if (p->rkey != nullptr) ucp_rkey_destroy(p->rkey);
    closing_[i] = std::move(closing_.back());
    closing_.pop_back();
  }
}

void UcxNode::finish_read(ReadSlot* s, Status st) {
  --inflight_;
  if (st.ok()) {
    ++counters_.reads;
    counters_.read_bytes += s->len;
  } else {
    ++counters_.read_errors;
  }
  DoneCb cb = s->cb;
  void* arg = s->arg;
  free_reads_.push_back(s);
  if (cb != nullptr) cb(arg, st);
}

void UcxNode::read_done(void* request, ucs_status_t st, void* user) {
  auto* s = static_cast<ReadSlot*>(user);
  ucp_request_free(request);
  if (st == UCS_OK) s->peer->answered = true;
  s->owner->finish_read(s, st == UCS_OK ? Status() : Status(Code::kConnectionReset));
}

Status UcxNode::read(uint32_t peer, uint64_t offset, void* dst, uint64_t len, DoneCb cb,
                     void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (peer >= peers_.size() || !peers_[peer]) return Code::kNotFound;
  Peer* p = peers_[peer].get();
  if (!p->ok) return Code::kConnectionReset;
  if (dst == nullptr || len == 0 || offset > p->desc.region_len ||
      len > p->desc.region_len - offset)
    return Code::kInvalidValue;
  if (free_reads_.empty()) return Code::kAgain;
  ReadSlot* s = free_reads_.back();
  free_reads_.pop_back();
  s->cb = cb;
  s->arg = arg;
  s->len = len;
  s->peer = p;
  ++inflight_;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = &UcxNode::read_done;
  prm.user_data = s;
  ucs_status_ptr_t r = ucp_get_nbx(p->ep, dst, len, p->desc.region_base + offset, p->rkey, &prm);
  if (r == nullptr) {  // done at once: report from here, as a completion would
    p->answered = true;
    finish_read(s, Code::kSuccess);
    return Code::kSuccess;
  }
  if (UCS_PTR_IS_ERR(r)) {
    --inflight_;
    free_reads_.push_back(s);
    ++counters_.read_errors;
    return Code::kConnectionReset;
  }
  return Code::kSuccess;
}

void UcxNode::set_control_handler(ControlCb cb, void* arg) {
  control_cb_ = cb;
  control_arg_ = arg;
}

void UcxNode::send_done(void* request, ucs_status_t, void* user) {
  ucp_request_free(request);
  static_cast<SendSlot*>(user)->done = true;
}

Status UcxNode::send_control(uint32_t peer, const void* msg, size_t len) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (peer >= peers_.size() || !peers_[peer]) return Code::kNotFound;
  Peer* p = peers_[peer].get();
  if (!p->ok) return Code::kConnectionReset;
  if (len > kMaxControl || (len != 0 && msg == nullptr)) return Code::kInvalidValue;
  auto s = std::make_unique<SendSlot>();
  s->owner = this;
  s->header = AmHeader{kAmMagic, static_cast<uint32_t>(len), node_id_};
  s->payload.assign(static_cast<const uint8_t*>(msg), static_cast<const uint8_t*>(msg) + len);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = &UcxNode::send_done;
  prm.user_data = s.get();
  ucs_status_ptr_t r = ucp_am_send_nbx(p->ep, kAmControl, &s->header, sizeof(s->header),
                                       s->payload.data(), len, &prm);
  if (UCS_PTR_IS_ERR(r)) return Code::kConnectionReset;
  ++counters_.controls_sent;
  if (r != nullptr) sends_.push_back(std::move(s));  // completes later
  return Code::kSuccess;
}

ucs_status_t UcxNode::on_control(void* arg, const void* header, size_t header_len, void* data,
                                 size_t len, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxNode*>(arg);
  AmHeader h{};
  if (header_len != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    ++self->counters_.bad_messages;
    return UCS_OK;  // dropped; a rendezvous message is released by returning OK
  }
  std::memcpy(&h, header, sizeof(h));
  if (h.magic != kAmMagic || h.length != len || len > kMaxControl) {
    ++self->counters_.bad_messages;
    return UCS_OK;
  }
  ++self->counters_.controls_received;
  uint32_t peer = kUnknownPeer;
  for (size_t i = 0; i < self->peers_.size(); ++i)
    if (self->peers_[i] && self->peers_[i]->desc.node_id == h.sender) {
      peer = static_cast<uint32_t>(i);
      self->peers_[i]->answered = true;
    }
  if (self->control_cb_ != nullptr)
    self->control_cb_(self->control_arg_, h.sender, peer, static_cast<const uint8_t*>(data), len);
  return UCS_OK;
}

}  // namespace dpukv
