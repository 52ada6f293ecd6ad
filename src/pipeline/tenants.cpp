#include "pipeline/tenants.hpp"

#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <utility>

#include "metad/assert.hpp"

namespace metad::pipeline {

token_digest token_sha256(std::string_view token) {
  token_digest out;
  // The low-level calls are deprecated in OpenSSL 3 in favour of EVP, whose one-shot and
  // context calls allocate (and fetch the algorithm under a lock) each time; these work on
  // a context on the stack.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, token.data(), token.size());
  SHA256_Final(out.data(), &ctx);
#pragma GCC diagnostic pop
  return out;
}

namespace {

constexpr std::size_t kTenantsFileBytesMax = 1 << 20;
constexpr std::int64_t kRanksQuotaMax = std::int64_t{1} << 24;  // as --ranks-max
// pages=N: as a rank's and a pool's page ceiling (--pages-per-rank-max's most, 2^48).
constexpr std::int64_t kPagesQuotaMax = std::int64_t{1} << 48;
constexpr std::string_view kLineShape = "NAME SHA256[,SHA256] [ranks=N] [pages=N] [vllm]";

bool tenant_char(char c, bool first) {
  const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (first) return letter;
  return letter || (c >= '0' && c <= '9') || c == '.' || c == '-';
}

// Why `name` cannot be a tenant's name ("" when it can): SGLang's tenant path segment,
// and not a word that starts another route.
std::string name_error(std::string_view name, std::span<const http::path_pattern> routes) {
  bool ok = !name.empty() && name.size() <= 64;
  for (std::size_t i = 0; ok && i < name.size(); ++i) ok = tenant_char(name[i], i == 0);
  if (!ok)
    return "'" + std::string(name) +
           "' is not a tenant name (a letter or '_', then up to 63 of A-Za-z0-9_.-)";
  for (const http::path_pattern& row : routes) {
    if (row.count > 0 && row.parts[0] == http::path_pattern::part::literal &&
        row.segments[0] == name)
      return "'" + std::string(name) + "' is not a tenant name: /" + std::string(name) +
             "/... is another route";
  }
  if (name == "_other")  // metrics.hpp's kOtherTenants
    return "'_other' is not a tenant name: /metrics sums the tenants past its first 1000 "
           "under tenant=\"_other\"";
  return "";
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool parse_hex_digest(std::string_view text, token_digest& out) {
  if (text.size() != 2 * out.size()) return false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

std::string quoted_field(std::string_view field) {
  constexpr std::size_t kShownMax = 80;
  if (field.size() <= kShownMax) return "'" + std::string(field) + "'";
  return "'" + std::string(field.substr(0, kShownMax)) + "...'";
}

// The N of `field` ("key=N"): "" or why not; `seen` refuses the key twice.
std::string parse_quota(std::string_view field, std::string_view key, std::int64_t max, bool& seen,
                        std::int64_t& out) {
  if (seen) return std::string(key) + "= is given twice";
  seen = true;
  const std::string_view digits = field.substr(key.size() + 1);
  std::int64_t n = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || n < 0 ||
      n > max)
    return quoted_field(field) + ": " + std::string(key) + "= takes an integer in [0, " +
           std::to_string(max) + "]";
  out = n;
  return "";
}

// One line's fields, split at spaces and tabs; a field starting with '#' ends the line.
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i == line.size() || line[i] == '#') break;
    const std::size_t begin = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    fields.push_back(line.substr(begin, i - begin));
  }
  return fields;
}

// One tenant's line (not blank, not a comment) into `t`; "" or why not.
std::string parse_line(std::span<const std::string_view> fields,
                       std::span<const http::path_pattern> routes, tenant& t) {
  if (std::string error = name_error(fields[0], routes); !error.empty()) return error;
  t.name.assign(fields[0]);
  if (fields.size() < 2)
    return "tenant " + t.name + " has no SHA-256 of its token (" + std::string(kLineShape) + ")";
  std::string_view hashes = fields[1];
  for (;;) {
    const std::size_t comma = hashes.find(',');
    const std::string_view hex = hashes.substr(0, comma);
    token_digest digest;
    if (!parse_hex_digest(hex, digest))
      return quoted_field(hex) +
             " is not a SHA-256 in hex (64 hex digits, as printf %s \"$TOKEN\" | sha256sum prints)";
    for (const token_digest& seen : t.hashes)
      if (seen == digest) return "tenant " + t.name + " names the same SHA-256 twice";
    t.hashes.push_back(digest);
    if (t.hashes.size() > 2)
      return "tenant " + t.name + " has more than two SHA-256s (two let a token be rotated)";
    if (comma == std::string_view::npos) break;
    hashes.remove_prefix(comma + 1);
  }
  bool ranks_seen = false, pages_seen = false;
  for (const std::string_view field : fields.subspan(2)) {
    if (field == "vllm") {
      if (t.vllm) return "vllm is given twice";
      t.vllm = true;
    } else if (field.starts_with("ranks=")) {
      if (std::string e = parse_quota(field, "ranks", kRanksQuotaMax, ranks_seen, t.ranks);
          !e.empty())
        return e;
    } else if (field.starts_with("pages=")) {
      if (std::string e = parse_quota(field, "pages", kPagesQuotaMax, pages_seen, t.pages);
          !e.empty())
        return e;
    } else {
      return "unknown field " + quoted_field(field) + " (" + std::string(kLineShape) + ")";
    }
  }
  return "";
}

}  // namespace

std::string parse_tenants(std::string_view text, std::span<const http::path_pattern> routes,
                          tenant_table& out) {
  out.tenants.clear();
  out.by_digest.clear();
  out.vllm = -1;
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    const std::vector<std::string_view> fields = fields_of(line);
    if (fields.empty()) continue;  // blank, or a comment
    const auto at = [line_no](const std::string& error) {
      return "line " + std::to_string(line_no) + ": " + error;
    };
    tenant t;
    t.line = line_no;
    if (std::string error = parse_line(fields, routes, t); !error.empty()) return at(error);
    for (const tenant& other : out.tenants) {
      if (other.name == t.name)
        return at("tenant " + t.name + " is named on line " + std::to_string(other.line) +
                  " already");
    }
    const auto index = static_cast<std::uint32_t>(out.tenants.size());
    for (const token_digest& digest : t.hashes) {
      if (const auto it = out.by_digest.find(digest); it != out.by_digest.end()) {
        const tenant& other = out.tenants[it->second];
        return at("this SHA-256 is tenant " + other.name + "'s already (line " +
                  std::to_string(other.line) + "): a token belongs to one tenant");
      }
    }
    if (t.vllm && out.vllm >= 0) {
      const tenant& other = out.tenants[static_cast<std::size_t>(out.vllm)];
      return at("vllm: tenant " + other.name + " (line " + std::to_string(other.line) +
                ") holds the unnamed vLLM state already; one tenant at most");
    }
    for (const token_digest& digest : t.hashes) out.by_digest.emplace(digest, index);
    if (t.vllm) out.vllm = static_cast<int>(index);
    out.tenants.push_back(std::move(t));
  }
  return "";
}

std::string load_tenants_file(const std::string& path, std::span<const http::path_pattern> routes,
                              tenant_table& out) {
  // Without blocking: a FIFO or a device must not hang the start or the reload.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return path + ": cannot open it";
  struct stat st {};
  std::string text;
  std::string error;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error = path + ": not a regular file";
  } else if (static_cast<std::uint64_t>(st.st_size) > kTenantsFileBytesMax) {
    error = path + ": over " + std::to_string(kTenantsFileBytesMax) + " bytes";
  } else {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  if (!error.empty()) return error;
  out.path = path;
  if (std::string parse_error = parse_tenants(text, routes, out); !parse_error.empty())
    return path + ": " + parse_error;
  return "";
}

void tenant_registry::recount(const std::unordered_map<std::string, std::int64_t>& sg_ranks,
                              const std::unordered_map<std::string, std::int64_t>& pages) {
  const std::lock_guard lock(usage_mutex_);
  for (auto& [name, record] : usage_) {
    record->sg_ranks.store(0, std::memory_order_relaxed);
    record->pages.store(0, std::memory_order_relaxed);
  }
  const auto record_of = [this](const std::string& name) -> tenant_usage& {
    auto it = usage_.find(name);
    if (it == usage_.end()) it = usage_.emplace(name, std::make_unique<tenant_usage>()).first;
    return *it->second;
  };
  for (const auto& [name, ranks] : sg_ranks)
    record_of(name).sg_ranks.store(ranks, std::memory_order_relaxed);
  for (const auto& [name, held] : pages)
    record_of(name).pages.store(held, std::memory_order_relaxed);
}

tenant_usage& tenant_registry::usage(std::string_view name) {
  const std::lock_guard lock(usage_mutex_);
  auto it = usage_.find(std::string(name));
  if (it == usage_.end())
    it = usage_.emplace(std::string(name), std::make_unique<tenant_usage>()).first;
  return *it->second;
}

int tenant_registry::space_of(std::string_view name) {
  const std::lock_guard lock(space_mutex_);
  const auto it = space_ids_.find(std::string(name));
  if (it != space_ids_.end()) return it->second;
  const int id = static_cast<int>(space_names_.size());
  if (id >= kSpacesMax) return -1;
  space_names_.emplace_back(name);
  space_ids_.emplace(std::string(name), id);
  spaces_.store(id + 1, std::memory_order_release);
  return id;
}

int tenant_registry::find_space(std::string_view name) const {
  const std::lock_guard lock(space_mutex_);
  const auto it = space_ids_.find(std::string(name));
  return it == space_ids_.end() ? -1 : it->second;
}

std::string tenant_registry::space_name(int id) const {
  const std::lock_guard lock(space_mutex_);
  METAD_ASSERT(id >= 0 && static_cast<std::size_t>(id) < space_names_.size());
  return space_names_[static_cast<std::size_t>(id)];
}

void tenant_registry::publish(std::shared_ptr<tenant_table> table) {
  METAD_ASSERT(table != nullptr);
  for (tenant& t : table->tenants) {
    t.usage = &usage(t.name);
    t.space = t.vllm ? 0 : space_of(t.name);
  }
  const std::uint64_t next = version_.load(std::memory_order_relaxed) + 1;
  table->version = next;
  {
    const std::lock_guard lock(table_mutex_);
    table_ = std::move(table);
  }
  version_.store(next, std::memory_order_release);
}

}  // namespace metad::pipeline
