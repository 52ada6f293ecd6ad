// libFuzzer harness for pipeline::parse_tenants (--tenants-file, read at start-up and on
// every SIGHUP): the whole input is the file. An accepted file must make a table that
// holds what the file's rules promise (docs/operations.md, *Tenants*): names of SGLang's
// shape, unique, none a route's first word nor `_other` (the metrics' overflow label);
// one or two hashes a tenant, each naming exactly one tenant through the digest index;
// at most one vllm tenant; quotas of -1 or >= 0 (pages= at most 2^48). A refused one names its
// line. Parsing is repeatable.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>

#include "fuzz_input.hpp"
#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"

using namespace metad;

namespace {

bool name_char(char c, bool first) {
  const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  return first ? alpha : alpha || (c >= '0' && c <= '9') || c == '.' || c == '-';
}

void check_table(const pipeline::tenant_table& table) {
  std::unordered_set<std::string_view> names;
  std::size_t hashes = 0;
  int vllm = -1;
  for (std::size_t i = 0; i < table.tenants.size(); ++i) {
    const pipeline::tenant& t = table.tenants[i];
    fuzz::require(!t.name.empty() && t.name.size() <= 64, "a name of 1 to 64 characters", t.name);
    for (std::size_t j = 0; j < t.name.size(); ++j)
      fuzz::require(name_char(t.name[j], j == 0), "a name of SGLang's shape", t.name);
    fuzz::require(names.insert(t.name).second, "a name once", t.name);
    fuzz::require(t.name != "_other", "not the metrics' overflow label", t.name);
    for (const auto& pattern : pipeline::kPatterns) {
      std::string_view path = pattern.path;
      if (path.size() > 1 && path[0] == '/' && path[1] != '{') {
        path.remove_prefix(1);
        fuzz::require(t.name != path.substr(0, path.find('/')), "no route's first word", t.name);
      }
    }
    fuzz::require(t.hashes.size() == 1 || t.hashes.size() == 2, "one or two hashes", t.name);
    hashes += t.hashes.size();
    for (const pipeline::token_digest& d : t.hashes)
      fuzz::require(table.find(d) == &t, "each hash finds its own tenant", t.name);
    fuzz::require(t.ranks >= -1, "a quota of -1 or more", t.name);
    fuzz::require(t.pages >= -1 && t.pages <= std::int64_t{1} << 48,
                  "a pages= quota of -1 (none) up to 2^48", t.name);
    fuzz::require(t.line >= 1, "a line number", t.name);
    if (t.vllm) {
      fuzz::require(vllm < 0, "one vllm tenant at most", t.name);
      vllm = static_cast<int>(i);
    }
  }
  fuzz::require(table.by_digest.size() == hashes, "the digest index holds every hash once");
  fuzz::require(table.vllm == vllm, "the vllm index names the vllm tenant");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  pipeline::tenant_table table;
  const std::string error = pipeline::parse_tenants(text, pipeline::kPatterns, table);
  pipeline::tenant_table again;
  fuzz::require(pipeline::parse_tenants(text, pipeline::kPatterns, again) == error,
                "parsing is repeatable", error);
  if (!error.empty()) {
    fuzz::require(error.rfind("line ", 0) == 0, "a refusal names its line", error);
    return 0;
  }
  check_table(table);
  fuzz::require(again.tenants.size() == table.tenants.size(), "the same tenants again");
  return 0;
}
