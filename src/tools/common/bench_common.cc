#include "tools/common/bench_common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>

#include <netinet/tcp.h>

#include <thread>

#include "cluster/directory/redis_server.h"
#include "runtime/arg_parse.h"
#include "runtime/child_process.h"

extern char** environ;

namespace dpukv::bench {

Status parse_size(const std::string& s, uint64_t* out) {
  std::string err;
  uint64_t v = 0;
  if (!parse_byte_size(s, &v, &err)) return Code::kInvalidValue;
  *out = v;
  return Code::kSuccess;
}

Status parse_size_list(const std::string& s, std::vector<uint64_t>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    uint64_t v;
    DPUKV_RETURN_IF_ERROR(parse_size(s.substr(pos, comma - pos), &v));
    if (v == 0) return Code::kInvalidValue;
    out->push_back(v);
    pos = comma + 1;
  }
  return out->empty() ? Status(Code::kInvalidValue) : Status();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string format_size(uint64_t b) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) b /= 1024, ++u;
  return std::to_string(b) + units[u];
}

LatencyRecorder::LatencyRecorder(size_t cap) : cap_(cap) {
  samples_.reserve(cap);
}

void LatencyRecorder::add(uint64_t ns) {
  ++seen_;
  if (ns > max_ns_) max_ns_ = ns;
  if (samples_.size() < cap_) {
    samples_.push_back(ns);
    return;
  }
  // Reservoir sampling keeps an unbiased sample of everything seen.
  rng_ ^= rng_ << 13, rng_ ^= rng_ >> 7, rng_ ^= rng_ << 17;
  uint64_t j = rng_ % seen_;
  if (j < cap_) samples_[j] = ns;
}

void LatencyRecorder::finish() {
  std::sort(samples_.begin(), samples_.end());
}

double LatencyRecorder::percentile_us(double p) const {
  if (samples_.empty()) return 0;
  // Nearest rank.
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples_.size())));
  if (rank == 0) rank = 1;
  if (rank > samples_.size()) rank = samples_.size();
  return static_cast<double>(samples_[rank - 1]) / 1e3;
}

std::vector<uint64_t> LatencyRecorder::histogram(double start_us, double width_us,
                                                 int buckets) const {
  std::vector<uint64_t> h(static_cast<size_t>(buckets), 0);
  for (uint64_t ns : samples_) {
    double us = static_cast<double>(ns) / 1e3;
    long b = us < start_us ? 0 : static_cast<long>((us - start_us) / width_us);
    if (b >= buckets) b = buckets - 1;
    ++h[static_cast<size_t>(b)];
  }
  return h;
}

Status parse_bucket_range(const std::string& s, HistogramSpec* out) {
  size_t comma = s.find(',');
  if (comma == std::string::npos) return Code::kInvalidValue;
  char* end = nullptr;
  std::string a = s.substr(0, comma), b = s.substr(comma + 1);
  double start = std::strtod(a.c_str(), &end);
  if (a.empty() || *end != '\0' || start < 0) return Code::kInvalidValue;
  double width = std::strtod(b.c_str(), &end);
  if (b.empty() || *end != '\0' || !(width > 0)) return Code::kInvalidValue;
  out->enabled = true;
  out->start_us = start;
  out->width_us = width;
  return Code::kSuccess;
}

bool pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

int num_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

bool write_csv(const OutputOptions& o, const std::vector<Json>& rows) {
  if (o.csv_path.empty() || rows.empty()) return true;
  struct stat st {};
  bool header = !(o.csv_append && stat(o.csv_path.c_str(), &st) == 0 && st.st_size > 0);
  std::ofstream f(o.csv_path, o.csv_append ? std::ios::app : std::ios::trunc);
  if (!f) {
    std::cerr << "dpukv: cannot write " << o.csv_path << ": " << std::strerror(errno) << "\n";
    return false;
  }
  auto scalar = [](const Json& v) { return !v.is_object() && !v.is_array(); };
  if (header) {
    bool first = true;
    for (auto it = rows[0].begin(); it != rows[0].end(); ++it) {
      if (!scalar(it.value())) continue;
      f << (first ? "" : ",") << it.key();
      first = false;
    }
    f << "\n";
  }
  for (const Json& r : rows) {
    bool first = true;
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (!scalar(it.value())) continue;
      f << (first ? "" : ",");
      if (it.value().is_string())
        f << it.value().get<std::string>();
      else
        f << it.value().dump();
      first = false;
    }
    f << "\n";
  }
  return static_cast<bool>(f);
}

Json machine_info() {
  std::string cpu;
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; cpu.empty() && std::getline(f, line);) {
    // x86: "model name"; Arm: "Model" (some kernels) or only "CPU part".
    for (const char* key : {"model name", "Model", "CPU part"}) {
      if (line.rfind(key, 0) != 0) continue;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      cpu = line.substr(colon + 1);
      cpu.erase(0, cpu.find_first_not_of(" \t"));
      if (std::string(key) == "CPU part") cpu = "Arm, CPU part " + cpu;
      break;
    }
  }
  const char* isa = "scalar";
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    isa = "avx512";
  else if (__builtin_cpu_supports("avx2"))
    isa = "avx2";
  else if (__builtin_cpu_supports("sse4.2"))
    isa = "sse4.2";
#elif defined(__aarch64__)
  isa = "neon";  // Advanced SIMD is part of AArch64
#endif
  utsname u{};
  const std::string kernel = uname(&u) == 0 ? u.release : "unknown";
  return Json{{"cpu", cpu.empty() ? "unknown" : cpu},
              // Online CPUs, not this thread's affinity: benches pin themselves.
              {"cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))},
              {"isa", isa},
              {"kernel", kernel}};
}

void print_machine_line() {
  const Json m = machine_info();
  std::printf("machine: %s, %d CPUs, %s, Linux %s\n", m["cpu"].get<std::string>().c_str(),
              m["cpus"].get<int>(), m["isa"].get<std::string>().c_str(),
              m["kernel"].get<std::string>().c_str());
}

double ratio(double value, double baseline) {
  const double r = baseline > 0 ? value / baseline : 0.0;
  return std::isfinite(r) ? r : 0.0;
}

Json with_baseline(Json row, std::string_view what, std::string_view unit, double baseline,
                   double ratio) {
  row["baseline"] = std::string(what);
  row["baseline_" + std::string(unit)] = baseline;
  row["ratio"] = ratio;
  return row;
}

void print_json(const std::string& name, const std::vector<Json>& rows) {
  Json out;
  out["bench"] = name;
  out["machine"] = machine_info();
  out["results"] = rows;
  std::cout << out.dump(2) << std::endl;
}

bool progress_enabled() {
  return isatty(STDERR_FILENO) != 0;
}

pid_t spawn_self(const std::vector<std::string>& args, int child_fd) {
  std::vector<char*> argv;
  static char self[] = "/proc/self/exe";
  argv.push_back(self);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (child_fd >= 0) posix_spawn_file_actions_adddup2(&fa, child_fd, 3);  // clears CLOEXEC
  pid_t pid = -1;
  int rc = posix_spawn(&pid, self, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

bool run_program(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return false;
  int status = 0;
  return reap_child(pid, &status) && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

pid_t start_redis_server(uint16_t* port, const std::string& bind) {
  RedisServerOptions o;
  o.bind = bind;
  o.wait_ms = 5000;
  return dpukv::start_redis_server(o, port);
}

bool run_gnuplot(const std::string& script, const std::string& out_path, std::string* err) {
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    *err = "cannot write " + out_path + ": " + std::strerror(errno);
    return false;
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    ::close(out);
    *err = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out, 1);
  char prog[] = "gnuplot";
  char* argv[] = {prog, nullptr};
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, prog, &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[0]);
  ::close(out);
  bool ok = rc == 0;
  if (ok) {
    size_t off = 0;
    while (off < script.size()) {
      const ssize_t w = ::write(p[1], script.data() + off, script.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
  }
  ::close(p[1]);
  int status = 0;
  if (ok && (!reap_child(pid, &status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    ok = false;
    *err = "gnuplot failed (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
  } else if (!ok) {
    *err = "cannot run gnuplot (is gnuplot installed? apt-get install gnuplot-nox)";
  }
  if (!ok) ::unlink(out_path.c_str());
  return ok;
}

void add_output_options(CLI::App* cmd, OutputOptions* out) {
  cmd->add_flag("--json", out->json,
                "Print one JSON object {\"bench\": NAME, \"results\": [rows]} instead of a table");
  cmd->add_option("--csv-output-file", out->csv_path, "Also write the rows to this CSV file");
  cmd->add_flag("--csv-append-mode", out->csv_append,
                "Append to the CSV file instead of replacing it");
}

double tcp_stream_seconds(uint64_t bytes, uint32_t reps) {
  const int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &alen) != 0) {
    if (l >= 0) close(l);
    return -1;
  }
  // The sender answers each one-byte request with `bytes` bytes, until EOF.
  std::thread sender([l, bytes] {
    const int s = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) return;
    std::vector<uint8_t> buf(std::min<uint64_t>(bytes, 1 << 20), 0x5a);
    uint8_t req;
    while (read(s, &req, 1) == 1) {
      for (uint64_t sent = 0; sent < bytes;) {
        const ssize_t w = write(s, buf.data(), std::min<uint64_t>(buf.size(), bytes - sent));
        if (w <= 0) break;
        sent += static_cast<uint64_t>(w);
      }
    }
    close(s);
  });
  const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  std::vector<double> t;
  if (c >= 0 && connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<uint8_t> buf(std::min<uint64_t>(bytes, 1 << 20));
    for (uint32_t r = 0; r <= reps; ++r) {  // round 0 warms up
      const uint8_t req = 1;
      const uint64_t t0 = now_ns();
      if (write(c, &req, 1) != 1) break;
      uint64_t got = 0;
      while (got < bytes) {
        const ssize_t n = read(c, buf.data(), std::min<uint64_t>(buf.size(), bytes - got));
        if (n <= 0) break;
        got += static_cast<uint64_t>(n);
      }
      if (got < bytes) break;
      if (r > 0) t.push_back((now_ns() - t0) / 1e9);
    }
  }
  if (c >= 0) close(c);
  shutdown(l, SHUT_RDWR);  // ends an accept that never got a connection
  sender.join();
  close(l);
  if (t.size() < reps) return -1;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace dpukv::bench
