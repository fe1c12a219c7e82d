// Network namespaces joined by veth pairs on a bridge, as hosts on one network
// segment would be: what `dpukv replay --nodes` runs its agents in and what
// `dpukv bench cluster` reads between. Needs root and `ip` from iproute2; all of
// it is removed when the object goes (or by remove()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpukv {

class NodeNetwork {
 public:
  NodeNetwork() = default;
  NodeNetwork(const NodeNetwork&) = delete;
  NodeNetwork& operator=(const NodeNetwork&) = delete;
  ~NodeNetwork() { remove(); }

  // Namespaces 0..nodes-1, each with a veth on the bridge and an address on one
  // /24 the bridge (the root namespace) also has. False if any step failed.
  bool create(uint32_t nodes);
  void remove();

  std::string bridge_ip() const { return subnet_ + "1"; }
  std::string ns(uint32_t i) const { return "dkr" + tag_ + "n" + std::to_string(i); }
  std::string ip(uint32_t i) const { return subnet_ + std::to_string(10 + i); }
  std::string veth(uint32_t i) const { return "v" + ns(i); }  // inside namespace i

  // For a process of one thread (a child after fork): moves it into namespace i as
  // `ip netns exec` does, with a mount namespace of its own whose /sys shows
  // namespace i's devices (UCX finds its network devices in /sys/class/net).
  bool enter(uint32_t i) const;

 private:
  std::string tag_, subnet_, bridge_;
  std::vector<std::string> made_;
};

}  // namespace dpukv
