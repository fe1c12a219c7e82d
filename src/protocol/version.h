// The one place the version is written (agent, clients, `dpukv --version`).
#pragma once

namespace dpukv {
inline constexpr const char kDpukvVersion[] = "0.2.0";
}  // namespace dpukv
