// One parser for the numbers a user types: flags, config-file values and DPUKV_*
// environment variables all go through these, so "0.25abc", "0x10", "-1", "nan",
// "1e30" or a port of 70000 are refused the same way everywhere, with a message
// that names the setting and what it accepts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpukv {

// A size as LMCache writes it: a plain decimal number is GiB ("0.25", "4"), and a
// number with a unit is that many bytes ("512M", "64K", "1.5G", "4096B"). Refuses
// signs, exponents, hex, nan/inf, trailing characters and sizes over 2^60 bytes.
bool parse_gib_size(const std::string& text, uint64_t* bytes, std::string* err);
// A byte size with an optional K/M/G/T unit ("64M", "4096").
bool parse_byte_size(const std::string& text, uint64_t* bytes, std::string* err);
// A TCP port: an integer 0..65535 (0 where the caller means "off").
bool parse_port(const std::string& text, int* port, std::string* err);
// A non-negative integer no larger than max.
bool parse_count(const std::string& text, uint64_t max, uint64_t* out, std::string* err);
// CPUs as SPDK's -m takes them: a hex mask with or without 0x ("0x6", "6") or
// a list in brackets ("[1,2]", "[0-3,8]"); CPUs 0..1023, at least one. cpus
// comes back in ascending order without repeats.
bool parse_cpu_mask(const std::string& text, std::vector<int>* cpus, std::string* err);
// true/false, yes/no, on/off, 1/0.
bool parse_bool(const std::string& text, bool* out, std::string* err);

}  // namespace dpukv
