// One asynchronous hiredis connection driven from a progress engine: its socket is
// watched in the engine's epoll set, commands queued on it are written from the
// engine's loop at once (the epoll set asks for EPOLLOUT only while the socket is
// full), and the owner hears when it is up and when it is gone. The directory
// keeps two: one for commands, one subscribed to the directory's events.
#pragma once

#include <hiredis/async.h>

#include <cstdint>
#include <string>

#include "runtime/progress_engine.h"

namespace dpukv {

class RedisLink {
 public:
  struct Events {
    void* owner = nullptr;
    void (*up)(void* owner) = nullptr;
    // The connection is gone (or never came up); every pending command has had its
    // callback, with no reply.
    void (*down)(void* owner, const char* why) = nullptr;
  };

  RedisLink(ProgressEngine* pe, Events events);
  RedisLink(const RedisLink&) = delete;
  RedisLink& operator=(const RedisLink&) = delete;
  ~RedisLink();  // pending callbacks run with no reply

  // Starts connecting; false (and down() told) if it cannot even start. The link
  // is up once Redis has answered its first command: AUTH (user may be empty: the
  // default user) when there is a password, else PING, so that a Redis that wants
  // a password, or refuses this one, is reported as such (down(), with Redis'
  // words) instead of failing every command later.
  bool connect(const std::string& host, uint16_t port, const std::string& user = "",
               const std::string& password = "");
  // After the replies to what was sent; down() is not told of a close asked for.
  void close();
  // Now, without waiting for replies.
  void drop();

  bool open() const { return ctx_ != nullptr; }
  bool up() const { return ctx_ != nullptr && up_; }
  // The owner of a context's callbacks (what Events::owner was).
  static void* owner_of(const redisAsyncContext* c);

  bool command(redisCallbackFn* cb, void* priv, int argc, const char** argv, const size_t* lens);
  bool formatted(redisCallbackFn* cb, void* priv, const char* cmd, size_t len);

  // Writes what is queued and brings the epoll set up to date: from the owner's
  // poll() and before the engine sleeps (arm_notification()).
  void service();

 private:
  struct Watch final : FdWatcher {
    RedisLink* link = nullptr;
    void on_fd_ready(uint32_t events) override;
  };
  static void on_connect(const redisAsyncContext* c, int status);
  static void on_hello(redisAsyncContext* c, void* reply, void* priv);
  static void on_disconnect(const redisAsyncContext* c, int status);
  static void add_read(void* p);
  static void del_read(void* p);
  static void add_write(void* p);
  static void del_write(void* p);
  static void cleanup(void* p);
  void update_watch();

  ProgressEngine* pe_;
  Events events_;
  redisAsyncContext* ctx_ = nullptr;
  bool up_ = false, closing_ = false;
  bool with_password_ = false;
  bool reading_ = false, writing_ = false, watched_ = false;
  uint32_t watched_events_ = 0;  // what the epoll set has for fd_
  int fd_ = -1;
  Watch watch_;
};

}  // namespace dpukv
