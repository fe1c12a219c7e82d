// The agent's settings as a user gives them, and the AgentOptions they become: what
// `dpukv agent` runs on, and what a program that embeds an agent can use without the
// CLI. Every setting has a config-file name (LMCache's where the concept is the
// same); a value is kept as text with where it came from, and is parsed once, after
// flags > environment > config file have been merged, by the one parser of its kind
// (runtime/arg_parse.h). examples/agent.yaml documents each.
//
// Problems are written to `why`, a line each, as a user can act on them ("FILE:LINE:
// unknown setting", "--max-requests '0': must be at least 1").
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "agent/agent.h"

namespace dpukv {

enum class SettingKind { kText, kGib, kBytes, kCount, kPort, kBool, kChoice };

struct AgentSetting {
  const char* name;
  const char* env;  // DPUKV_* variable, or null
  SettingKind kind;
  uint64_t max;         // kCount: largest value
  const char* choices;  // kChoice: "a|b"
  std::string value;    // text as given
  std::string origin;   // "--flag", "DPUKV_X", "FILE:LINE", or "" for the default
  uint64_t min = 0;     // kCount: smallest value
};

struct AgentSettings {
  std::vector<AgentSetting> all;
  AgentSetting* find(const std::string& name) {
    for (AgentSetting& s : all)
      if (name == s.name) return &s;
    return nullptr;
  }
  AgentSetting& at(const char* name) { return *find(name); }
  bool given(const char* name) { return !at(name).origin.empty(); }
};

// Every setting with its embedded default.
AgentSettings default_agent_settings();
// A config file of "name: value" lines (YAML's simple form, as LMCache's files use).
bool apply_config_file(const std::string& path, AgentSettings* st, std::ostream& why);
// The DPUKV_* variables that are set and not empty.
void apply_environment(AgentSettings* st);
// Parses every setting by its kind; writes each bad one. False if any was bad.
bool check_settings(const AgentSettings& st, std::ostream& why);
// Checked settings as options (the memory tier's default from the available RAM,
// the cluster's URL and password, ...); false if they do not make an agent.
bool agent_options_from_settings(AgentSettings* st, AgentOptions* out, std::ostream& why);

// "--flag", "DPUKV_X" or "FILE:LINE: name" (where a value came from), for messages.
std::string setting_origin(const AgentSetting& s);
// A redis:// URL with its password (if any) replaced by ***, for logs and errors.
std::string masked_redis_url(const std::string& url);
// A size as the agent's messages write it ("512.0 MiB", "12.5 GiB").
std::string size_text(uint64_t bytes);
// --eviction's help, from the cache's policy table.
const char* eviction_setting_help();

}  // namespace dpukv
