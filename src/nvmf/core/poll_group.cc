#include "nvmf/core/poll_group.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "runtime/clock.h"

namespace dpukv::nvme {

PollGroup::PollGroup() : epfd_(epoll_create1(EPOLL_CLOEXEC)) {
  wake_.fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

PollGroup::~PollGroup() {
  stop();
  if (epfd_ >= 0) ::close(epfd_);
  if (wake_.fd >= 0) ::close(wake_.fd);
}

Status PollGroup::start(int cpu) {
  if (epfd_ < 0 || wake_.fd < 0 || !watch(wake_.fd, EPOLLIN, &wake_)) return Code::kDriver;
  calls_.set_wake_fd(wake_.fd);
  thread_ = std::thread([this, cpu] { run(cpu); });
  return Code::kSuccess;
}

void PollGroup::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  (void)::write(wake_.fd, &one, sizeof one);
  thread_.join();
}

bool PollGroup::watch(int fd, uint32_t events, PollWatcher* w) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  return epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

bool PollGroup::rewatch(int fd, uint32_t events, PollWatcher* w) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  return epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0;
}

void PollGroup::unwatch(int fd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

void PollGroup::remove_poller(Poller* p) {
  std::erase(pollers_, p);
}

int PollGroup::Wake::drain(PollWatcher* self, uint32_t) {
  uint64_t v;
  (void)::read(static_cast<Wake*>(self)->fd, &v, sizeof v);
  return 0;  // what woke it is a call, run at the end of the pass
}

void PollGroup::run(int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  uint64_t last_work = monotonic_us(), last_tick = monotonic_ms();
  epoll_event evs[64];
  while (!stop_.load(std::memory_order_relaxed)) {
    const bool idle = monotonic_us() - last_work > 2000;
    const int n = epoll_wait(epfd_, evs, 64, idle ? 1 : 0);
    int work = 0;
    for (int i = 0; i < n; ++i)  // every entry's data is a watcher (watch())
      work += static_cast<PollWatcher*>(evs[i].data.ptr)->on_event(evs[i].events);
    for (Poller* p : pollers_) work += p->poll();
    if (work > 0) last_work = monotonic_us();
    const uint64_t ms = monotonic_ms();
    if (ms - last_tick >= 100) {
      last_tick = ms;
      for (Poller* p : pollers_) p->tick(ms);
    }
    if (calls_.run_pending()) last_work = monotonic_us();
  }
}

}  // namespace dpukv::nvme
