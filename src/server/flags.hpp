// The command line: one table of flags (src/server/flags.cpp), each row a flag's name,
// value, help text (its default printed from config{}), the config field it sets and
// the check of its value; `--help` is generated from the rows. validate() holds every
// rule that spans flags; main and server::server both call it. Start-up only.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "metad/config.hpp"

namespace metad::flags {

// A bad flag or flag combination: the message names the flag; main exits 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct row {
  std::string_view name;
  std::string_view metavar;  // empty: a switch (set gets an empty value)
  // Lines joined by '\n'; "{}" is where the default goes, shown(config{}).
  std::string_view help;
  // Checks `value` and stores it in its config field; throws usage_error naming `flag`.
  // Null: an action main runs (--help, --version, --verify-data-dir).
  void (*set)(config& cfg, std::string_view flag, std::string_view value);
  std::string (*shown)(const config& defaults) = nullptr;  // the default as --help prints it
};

// Every flag, in --help's order.
const std::vector<row>& table();

// What the command line asks for: serve `cfg`, or an action.
struct parsed {
  enum class action { serve, help, version, verify_data_dir } what = action::serve;
  config cfg;
  std::string verify_dir;  // --verify-data-dir DIR
};
// Parses argv (and validates the result when serving); throws usage_error.
parsed parse(int argc, const char* const* argv);

// --help's text, the defaults printed from config{}.
std::string usage();
// --version's text: the version, the transports, whether io_uring is usable here.
std::string version();

// Every rule that spans flags (--no-tcp needs --unix, the --ha-* and --repl-* sets,
// --import-sglang-state needs --data-dir): why `cfg` is unusable, naming the flags;
// empty when usable.
std::string validate(const config& cfg);

}  // namespace metad::flags
