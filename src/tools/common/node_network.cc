#include "tools/common/node_network.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include "tools/common/bench_common.h"

namespace dpukv {

bool NodeNetwork::create(uint32_t nodes) {
  tag_ = std::to_string(getpid() % 100000);
  subnet_ = "10.197." + std::to_string(getpid() % 200 + 20) + ".";
  const std::string br = "dkr" + tag_ + "b";
  if (!bench::run_program({"ip", "link", "add", br, "type", "bridge"})) return false;
  bridge_ = br;
  if (!bench::run_program({"ip", "addr", "add", bridge_ip() + "/24", "dev", br}) ||
      !bench::run_program({"ip", "link", "set", br, "up"}))
    return false;
  for (uint32_t i = 0; i < nodes; ++i) {
    const std::string n = ns(i), v = veth(i), p = "p" + n;
    if (!bench::run_program({"ip", "netns", "add", n})) return false;
    made_.push_back(n);
    if (!bench::run_program({"ip", "link", "add", v, "type", "veth", "peer", "name", p}) ||
        !bench::run_program({"ip", "link", "set", p, "master", br, "up"}) ||
        !bench::run_program({"ip", "link", "set", v, "netns", n}) ||
        !bench::run_program({"ip", "-n", n, "addr", "add", ip(i) + "/24", "dev", v}) ||
        !bench::run_program({"ip", "-n", n, "link", "set", v, "up"}) ||
        !bench::run_program({"ip", "-n", n, "link", "set", "lo", "up"}))
      return false;
  }
  return true;
}

void NodeNetwork::remove() {
  for (const std::string& n : made_) (void)bench::run_program({"ip", "netns", "del", n});
  made_.clear();
  if (!bridge_.empty()) (void)bench::run_program({"ip", "link", "del", bridge_});
  bridge_.clear();
}

bool NodeNetwork::enter(uint32_t i) const {
  const int fd = ::open(("/var/run/netns/" + ns(i)).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = setns(fd, CLONE_NEWNET) == 0;
  ::close(fd);
  // The mounts of this process only: nothing it mounts reaches the host's.
  return ok && unshare(CLONE_NEWNS) == 0 &&
         mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) == 0 &&
         umount2("/sys", MNT_DETACH) == 0 && mount(ns(i).c_str(), "/sys", "sysfs", 0, nullptr) == 0;
}

}  // namespace dpukv
