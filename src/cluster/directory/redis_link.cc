#include "cluster/directory/redis_link.h"

#include <sys/epoll.h>

namespace dpukv {

RedisLink::RedisLink(ProgressEngine* pe, Events events) : pe_(pe), events_(events) {
  watch_.link = this;
}

RedisLink::~RedisLink() {
  drop();
}

void* RedisLink::owner_of(const redisAsyncContext* c) {
  return static_cast<RedisLink*>(c->data)->events_.owner;
}

bool RedisLink::connect(const std::string& host, uint16_t port, const std::string& user,
                        const std::string& password) {
  redisAsyncContext* c = redisAsyncConnect(host.c_str(), port);
  if (c == nullptr || c->err) {
    const std::string why = c != nullptr ? c->errstr : "out of memory";
    if (c != nullptr) redisAsyncFree(c);
    if (events_.down != nullptr) events_.down(events_.owner, why.c_str());
    return false;
  }
  ctx_ = c;
  up_ = closing_ = false;
  c->data = this;
  c->ev.data = this;
  c->ev.addRead = &RedisLink::add_read;
  c->ev.delRead = &RedisLink::del_read;
  c->ev.addWrite = &RedisLink::add_write;
  c->ev.delWrite = &RedisLink::del_write;
  c->ev.cleanup = &RedisLink::cleanup;
  redisAsyncSetConnectCallback(c, &RedisLink::on_connect);
  redisAsyncSetDisconnectCallback(c, &RedisLink::on_disconnect);
  // The first command, sent when the socket connects; its answer brings the link up.
  with_password_ = !password.empty();
  const char* argv[3];
  size_t lens[3];
  int argc = 0;
  auto arg = [&](const std::string& a) {
    argv[argc] = a.data();
    lens[argc++] = a.size();
  };
  static const std::string kPing = "PING", kAuth = "AUTH";
  if (!with_password_) {
    arg(kPing);
  } else {
    arg(kAuth);
    if (!user.empty()) arg(user);  // else the default user
    arg(password);
  }
  const int rc = redisAsyncCommandArgv(c, &RedisLink::on_hello, this, argc, argv, lens);
  if (rc != REDIS_OK) {
    drop();
    if (events_.down != nullptr) events_.down(events_.owner, "cannot queue the first command");
    return false;
  }
  writing_ = true;  // the connection completes when the socket becomes writable
  update_watch();
  return true;
}

void RedisLink::close() {
  if (ctx_ == nullptr) return;
  if (!up_) {  // still connecting: nothing to wait for
    drop();
    return;
  }
  closing_ = true;
  redisAsyncDisconnect(ctx_);
}

void RedisLink::drop() {
  if (ctx_ == nullptr) return;
  redisAsyncContext* c = ctx_;
  ctx_ = nullptr;
  up_ = false;
  c->onDisconnect = nullptr;
  redisAsyncFree(c);
}

bool RedisLink::command(redisCallbackFn* cb, void* priv, int argc, const char** argv,
                        const size_t* lens) {
  return ctx_ != nullptr && redisAsyncCommandArgv(ctx_, cb, priv, argc, argv, lens) == REDIS_OK;
}

bool RedisLink::formatted(redisCallbackFn* cb, void* priv, const char* cmd, size_t len) {
  return ctx_ != nullptr && redisAsyncFormattedCommand(ctx_, cb, priv, cmd, len) == REDIS_OK;
}

void RedisLink::service() {
  if (ctx_ != nullptr && up_ && writing_ && !(watched_events_ & EPOLLOUT))
    redisAsyncHandleWrite(ctx_);
  update_watch();
}

void RedisLink::on_connect(const redisAsyncContext* c, int status) {
  auto* l = static_cast<RedisLink*>(c->data);
  if (status != REDIS_OK) {  // hiredis frees the context after this
    l->ctx_ = nullptr;
    cleanup(l);
    if (l->events_.down != nullptr) l->events_.down(l->events_.owner, c->errstr);
    return;
  }
  // Up when the first command is answered (on_hello).
}

void RedisLink::on_hello(redisAsyncContext* c, void* r, void*) {
  auto* l = static_cast<RedisLink*>(c->data);
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || l->ctx_ != c) return;  // gone meanwhile: down() says so
  if (reply->type == REDIS_REPLY_ERROR) {
    std::string why = "Redis refused this agent: " + std::string(reply->str, reply->len);
    if (!l->with_password_)
      why += " (give the password with cluster_password_file or DPUKV_CLUSTER_PASSWORD)";
    l->drop();
    if (l->events_.down != nullptr) l->events_.down(l->events_.owner, why.c_str());
    return;
  }
  l->up_ = true;
  if (l->events_.up != nullptr) l->events_.up(l->events_.owner);
}

void RedisLink::on_disconnect(const redisAsyncContext* c, int status) {
  auto* l = static_cast<RedisLink*>(c->data);
  l->ctx_ = nullptr;
  l->up_ = false;
  const bool asked = l->closing_ && status == REDIS_OK;
  if (!asked && l->events_.down != nullptr) l->events_.down(l->events_.owner, c->errstr);
}

// hiredis asks for read and write interest as it queues and sends; the epoll set
// is brought up to date in service(), so a command written at once costs no
// epoll_ctl calls.
void RedisLink::update_watch() {
  if (ctx_ == nullptr) return;
  const uint32_t ev = (reading_ ? EPOLLIN : 0u) | (writing_ ? EPOLLOUT : 0u);
  if (watched_ && ev == watched_events_) return;
  fd_ = ctx_->c.fd;
  if (!watched_) {
    if (pe_->watch_fd(fd_, ev, &watch_).ok()) {
      watched_ = true;
      watched_events_ = ev;
    }
  } else if (pe_->modify_fd(fd_, ev, &watch_).ok()) {
    watched_events_ = ev;
  }
}

void RedisLink::add_read(void* p) {
  static_cast<RedisLink*>(p)->reading_ = true;
}
void RedisLink::del_read(void* p) {
  static_cast<RedisLink*>(p)->reading_ = false;
}
void RedisLink::add_write(void* p) {
  static_cast<RedisLink*>(p)->writing_ = true;
}
void RedisLink::del_write(void* p) {
  static_cast<RedisLink*>(p)->writing_ = false;
}
void RedisLink::cleanup(void* p) {
  auto* l = static_cast<RedisLink*>(p);
  if (l->watched_) l->pe_->unwatch_fd(l->fd_, &l->watch_);
  l->watched_ = l->reading_ = l->writing_ = false;
  l->watched_events_ = 0;
}

void RedisLink::Watch::on_fd_ready(uint32_t events) {
  redisAsyncContext* c = link->ctx_;
  if (c == nullptr) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) redisAsyncHandleRead(c);
  if (link->ctx_ == c && (events & EPOLLOUT)) redisAsyncHandleWrite(c);
}

}  // namespace dpukv
