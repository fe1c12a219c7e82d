// What the CUDA tests share (tests only): which driver they load, fault injection
// into the test double, and this test binary run again as a child process for one
// test (the other side of an IPC handle).
#pragma once

#include <dlfcn.h>
#include <spawn.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace dpukv::cuda_test {

// DPUKV_CUDA_DRIVER (NVIDIA's driver on a GPU machine), else the test double.
inline std::string library() {
  const char* named = std::getenv("DPUKV_CUDA_DRIVER");
  return named != nullptr && *named != '\0' ? named : DPUKV_CUDA_DOUBLE;
}

// Injects a fault into the double; false on a real driver (those tests skip). The
// library stays open: the double's state, and the fault, outlive the call.
inline bool inject(const char* what) {
  static void* h = ::dlopen(library().c_str(), RTLD_NOW | RTLD_LOCAL);
  auto* f =
      h ? reinterpret_cast<void (*)(const char*)>(::dlsym(h, "dpukv_cuda_double_fault")) : nullptr;
  if (f == nullptr) return false;
  f(what);
  return true;
}

// Starts bin with args (args[0] included) and env added to this process's
// environment (the first of a name wins); fa (may be null) sets up its
// descriptors. -1 on failure.
inline pid_t spawn_with_env(const std::string& bin, std::vector<std::string> args,
                            std::vector<std::string> env, const posix_spawn_file_actions_t* fa) {
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  for (auto& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  pid_t pid = -1;
  return posix_spawn(&pid, bin.c_str(), fa, nullptr, argv.data(), envp.data()) == 0 ? pid : -1;
}

// Starts this test binary for the one test `test`.
inline pid_t spawn_test(const std::string& test, std::vector<std::string> env,
                        const posix_spawn_file_actions_t* fa) {
  return spawn_with_env("/proc/self/exe", {"/proc/self/exe", "--gtest_filter=" + test},
                        std::move(env), fa);
}

}  // namespace dpukv::cuda_test
