// Pieces every `dpukv bench X` shares: size parsing, latency statistics and
// histograms, CPU pinning, and the three outputs (human table, --json object,
// --csv-output-file rows).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/clock.h"
#include "runtime/status.h"

namespace dpukv::bench {

using Json = nlohmann::ordered_json;

// "64", "4K", "1M", "2G" (binary multiples). INVALID_VALUE on anything else.
Status parse_size(const std::string& s, uint64_t* out);
Status parse_size_list(const std::string& s, std::vector<uint64_t>* out);
std::string format_size(uint64_t bytes);  // 4096 -> "4K"
// The middle sample (the upper one of an even count); v must not be empty.
double median(std::vector<double> v);

// Latency samples in nanoseconds. Keeps at most `cap` samples (reservoir beyond).
class LatencyRecorder {
 public:
  explicit LatencyRecorder(size_t cap = 1u << 21);
  void add(uint64_t ns);
  size_t count() const { return seen_; }
  // Sorts the kept samples; call once before percentile().
  void finish();
  double percentile_us(double p) const;  // p in [0, 100]
  double max_us() const { return max_ns_ / 1e3; }
  // Bucket counts for [start, start+width), ... ; first and last buckets collect
  // everything below and above.
  std::vector<uint64_t> histogram(double start_us, double width_us, int buckets) const;

 private:
  std::vector<uint64_t> samples_;
  size_t cap_;
  size_t seen_ = 0;
  uint64_t max_ns_ = 0;
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;
};

struct HistogramSpec {
  bool enabled = false;
  double start_us = 0, width_us = 1;
  int buckets = 20;
};
// Parses "START,WIDTH" (microseconds).
Status parse_bucket_range(const std::string& s, HistogramSpec* out);

// Pins the calling thread to one CPU; false if it cannot.
bool pin_current_thread(int cpu);
int num_cpus();

// Median seconds of `reps` transfers of `bytes` over a loopback TCP stream from a
// thread of this process (a raw-socket baseline: the kernel's two copies and
// nothing else); a negative value if the sockets fail.
double tcp_stream_seconds(uint64_t bytes, uint32_t reps);

inline uint64_t now_ns() {
  return monotonic_ns();
}

struct OutputOptions {
  bool json = false;
  std::string csv_path;
  bool csv_append = false;
};

// --json, --csv-output-file and --csv-append-mode, the same on every benchmark.
void add_output_options(CLI::App* cmd, OutputOptions* out);

// Writes the rows (scalar fields only) to a CSV file, header unless appending to a
// non-empty file. Returns false and prints why on failure.
bool write_csv(const OutputOptions& o, const std::vector<Json>& rows);

// What figures were measured on, so figures from different machines are not
// compared by mistake: the CPU model, CPUs online, the widest vector ISA the CPU
// offers ("avx512", "avx2", "sse4.2", "neon", "scalar"), the kernel release.
Json machine_info();
// "machine: <cpu>, <n> CPUs, <isa>, Linux <release>" on stdout (under a table).
void print_machine_line();

// The same-run comparison every row carries, built in one place: "baseline" (what
// was measured beside it), "baseline_<unit>" (its figure) and "ratio".
// ratio(): value / baseline, or 0 when the baseline could not be measured (no inf
// or NaN reaches the JSON).
double ratio(double value, double baseline);
Json with_baseline(Json row, std::string_view what, std::string_view unit, double baseline,
                   double ratio);
// The common case: the ratio of value to the baseline.
inline Json compared(Json row, std::string_view what, std::string_view unit, double value,
                     double baseline) {
  return with_baseline(std::move(row), what, unit, baseline, ratio(value, baseline));
}

// Prints `{"bench": name, "machine": machine_info(), "results": rows}` on stdout.
void print_json(const std::string& name, const std::vector<Json>& rows);

// True if stderr is a terminal (progress lines go there).
bool progress_enabled();

// Starts this executable again with args; child_fd (if >= 0) becomes fd 3 in the
// child. Returns the pid or -1.
pid_t spawn_self(const std::vector<std::string>& args, int child_fd);
// Starts Debian's redis-server on a free port of 127.0.0.1 (nothing saved to disk)
// and waits until it accepts connections; -1 if there is none to start or it did
// not come up. Kill it with signal_child + reap_child.
// bind: the address it listens on (another than loopback turns protected mode off:
// the agents that reach it there are ours).
pid_t start_redis_server(uint16_t* port, const std::string& bind = "127.0.0.1");
// Runs a program found on PATH with its output discarded; true if it exited 0.
bool run_program(const std::vector<std::string>& argv);

// Renders a gnuplot script into out_path without a shell: gnuplot is run from argv
// with the script on its stdin and the file as its stdout, so the file name never
// reaches gnuplot or a shell. false, with the reason, if gnuplot is missing or
// fails (the partial file is removed).
bool run_gnuplot(const std::string& script, const std::string& out_path, std::string* err);

}  // namespace dpukv::bench
