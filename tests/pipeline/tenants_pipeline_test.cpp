// Tenants bound to tokens (--tenants-file) through the whole pipeline, byte-in/byte-out,
// on 1 and 3 simulated cores: the answers' bytes (401, each 403), SGLang's /{rank}/...
// on the token's tenant, vLLM's API on each tenant's own state (the vllm tenant's is the
// unnamed one), ranks=N counted across cores, and a table published while one connection
// stays open (a reload).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <string_view>

#include "basic_sim_node.hpp"
#include "pipeline/consistency.hpp"
#include "pipeline/metrics.hpp"
#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"

namespace {

using namespace metad;

constexpr std::string_view kTpNoContent = "HTTP/1.1 204 No Content\r\n\r\n";
constexpr std::string_view kTpUnauthorized =
    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: "
    "44\r\nwww-authenticate: Bearer\r\n\r\n{\"detail\":\"Missing or invalid bearer token\"}";

std::string tp_json(std::string_view status_line, std::string_view body) {
  return fmt::format(
      "HTTP/1.1 {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}", status_line,
      body.size(), body);
}
std::string tp_forbidden(std::string_view detail) {
  return tp_json("403 Forbidden", fmt::format(R"({{"detail":"{}"}})", detail));
}

std::string tp_hex(std::string_view token) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char b : pipeline::token_sha256(token)) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

class TenantsPipeline : public ::testing::TestWithParam<int> {
 protected:
  static config operator_tokens() {
    config cfg;
    cfg.auth_token = "operator";
    cfg.admin_token = "admin";
    cfg.tenants_file = "tenants";  // what the server reads; here the table is published below
    return cfg;
  }
  TenantsPipeline() : n_(operator_tokens(), GetParam()) {
    publish("a " + tp_hex("token-a") + " ranks=2 vllm\nb " + tp_hex("token-b") + "\n");
  }
  void publish(const std::string& text) {
    auto table = std::make_shared<pipeline::tenant_table>();
    ASSERT_EQ(pipeline::parse_tenants(text, pipeline::kPatterns, *table), "");
    n_.state().tenants.publish(std::move(table));
  }
  std::string post_as(std::string_view token, std::string_view path, std::string_view body) {
    return n_.send(
        fmt::format("POST {} HTTP/1.1\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{}",
                    path, token, body.size(), body));
  }
  // The admin's call on a tenant's vLLM state (X-Metad-Tenant; "": none).
  std::string admin_post(std::string_view tenant, std::string_view path, std::string_view body) {
    const std::string header =
        tenant.empty() ? std::string() : fmt::format("x-metad-tenant: {}\r\n", tenant);
    return n_.send(fmt::format(
        "POST {} HTTP/1.1\r\nauthorization: Bearer admin\r\n{}content-length: {}\r\n\r\n{}", path,
        header, body.size(), body));
  }
  std::string get_as(std::string_view token, std::string_view path) {
    return n_.send(fmt::format("GET {} HTTP/1.1\r\nauthorization: Bearer {}\r\n\r\n", path, token));
  }
  // The hf3fs_metad_tenant_* lines of /metrics (the operator's token).
  std::string tenant_lines() {
    const std::string answer = get_as("operator", "/metrics");
    std::istringstream in(answer.substr(answer.find("\r\n\r\n") + 4));
    std::string out;
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("hf3fs_metad_tenant_")) out += line + "\n";
    return out;
  }
  static std::string status_of(const std::string& answer) {
    return answer.substr(0, answer.find("\r\n"));
  }

  server_test::memory_node n_;
};

INSTANTIATE_TEST_SUITE_P(Cores, TenantsPipeline, ::testing::Values(1, 3));

TEST_P(TenantsPipeline, RankPathsActOnTheTokensTenant) {
  EXPECT_EQ(post_as("token-a", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/0/reserve_and_allocate_page_indices", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"indices":[[false,3]]})"));
  EXPECT_EQ(post_as("token-a", "/0/confirm_write", R"({"written_keys_to_confirm":[["k",3]]})"),
            kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/a/0/exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[true]})"));
  // b's rank 0 is b's: not there, then empty.
  EXPECT_EQ(status_of(post_as("token-b", "/0/exists", R"({"keys":["k"]})")),
            "HTTP/1.1 404 Not Found");
  EXPECT_EQ(post_as("token-b", "/b/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-b", "/0/exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  EXPECT_EQ(post_as("token-b", "/0/get_page_indices", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"indices":[null]})"));
  EXPECT_EQ(post_as("token-b", "/a/0/get_page_indices", R"({"keys":["k"]})"),
            tp_forbidden("tenant b's token may not use tenant a's pools: a token acts on its own "
                         "tenant's (/b/{rank}/... or /{rank}/...)"));
  // No token, a wrong one, the hash itself, the operator's on the API: the canned 401.
  EXPECT_EQ(n_.send("POST /0/exists HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}"), kTpUnauthorized);
  EXPECT_EQ(post_as("token-c", "/0/exists", "{}"), kTpUnauthorized);
  EXPECT_EQ(post_as(tp_hex("token-a"), "/0/exists", "{}"), kTpUnauthorized);
  EXPECT_EQ(post_as("operator", "/0/exists", "{}"), kTpUnauthorized);
  // The admin names the tenant in the path.
  EXPECT_EQ(post_as("token-a", "/a/0/clear", "{}"), kTpUnauthorized);
  EXPECT_EQ(post_as("admin", "/a/0/clear", "{}"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/0/exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
}

TEST_P(TenantsPipeline, VllmIsEachTenantsOwnAndTheOperatorsEndpointsTheOperators) {
  EXPECT_EQ(post_as("token-b", "/keys/batch_exists", R"({"keys":[]})"),
            tp_json("200 OK", R"({"exists":[]})"));
  EXPECT_EQ(post_as("token-a", "/keys/batch_exists", R"({"keys":[]})"),
            tp_json("200 OK", R"({"exists":[]})"));
  EXPECT_EQ(get_as("token-a", "/metrics"),
            tp_forbidden("/metrics shows every tenant's state: it takes --auth-token-file's or "
                         "--admin-token-file's token, not a tenant's (tenant a)"));
  EXPECT_EQ(status_of(get_as("token-a", "/stats")), "HTTP/1.1 200 OK");  // its own
  EXPECT_EQ(status_of(get_as("operator", "/stats")), "HTTP/1.1 200 OK");
  EXPECT_EQ(status_of(get_as("admin", "/metrics")), "HTTP/1.1 200 OK");
  // A known token on no route: the 404.
  EXPECT_EQ(status_of(post_as("token-b", "/nowhere", "{}")), "HTTP/1.1 404 Not Found");
}

TEST_P(TenantsPipeline, RanksQuotaCountsRanksOnEveryCore) {
  EXPECT_EQ(post_as("token-a", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/1/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/1/initialize", R"({"num_pages":4,"namespace":"swa"})"),
            kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/2/initialize", R"({"num_pages":4})"),
            tp_forbidden("Rank 2 namespace 'kv' not initialized: tenant a has SGLang pools on as "
                         "many ranks as its quota allows (ranks=2 in --tenants-file)"));
  EXPECT_EQ(post_as("token-b", "/2/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(status_of(post_as("token-a", "/rank/5/initialize", R"({"num_pages":4})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(status_of(post_as("token-a", "/rank/6/initialize", R"({"num_pages":4})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(post_as("token-a", "/rank/7/initialize", R"({"num_pages":4})"),
            tp_forbidden("Rank 7 not initialized: tenant a has as many vLLM ranks as its quota "
                         "allows (ranks=2 in --tenants-file)"));
}

TEST_P(TenantsPipeline, APublishedTableServesTheNextRequestOnTheSameConnection) {
  EXPECT_EQ(post_as("token-a", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a2", "/0/initialize", R"({"num_pages":4})"), kTpUnauthorized);
  publish("a " + tp_hex("token-a") + "," + tp_hex("token-a2") + " ranks=2 vllm\nc " +
          tp_hex("token-c") + "\n");
  EXPECT_EQ(post_as("token-a2", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-c", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-b", "/0/initialize", R"({"num_pages":4})"), kTpUnauthorized);
  publish("a " + tp_hex("token-a2") + " ranks=2 vllm\n");
  EXPECT_EQ(post_as("token-a", "/0/exists", "{}"), kTpUnauthorized);
  EXPECT_EQ(post_as("token-a2", "/0/exists", "{}"), tp_json("200 OK", R"({"exists":[]})"));
  // The usage stayed with tenant a across both tables: rank 0 counts, one more rank fits.
  EXPECT_EQ(post_as("token-a2", "/1/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(status_of(post_as("token-a2", "/2/initialize", R"({"num_pages":4})")),
            "HTTP/1.1 403 Forbidden");
}

// Each tenant's figures apart: its keys and pages (SGLang pools; vLLM's state for the
// vllm tenant), requests by API and existence probes, summed over the cores.
TEST_P(TenantsPipeline, MetricsShowEachTenantsFiguresApart) {
  EXPECT_EQ(post_as("token-a", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/0/reserve_and_allocate_page_indices", R"({"keys":["k","l"]})"),
            tp_json("200 OK", R"({"indices":[[false,3],[false,2]]})"));
  EXPECT_EQ(post_as("token-a", "/0/confirm_write", R"({"written_keys_to_confirm":[["k",3]]})"),
            kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/0/exists", R"({"keys":["k","l","m"]})"),
            tp_json("200 OK", R"({"exists":[true,false,false]})"));
  EXPECT_EQ(post_as("token-a", "/keys/batch_exists", R"({"keys":["x","y"]})"),
            tp_json("200 OK", R"({"exists":[false,false]})"));
  EXPECT_EQ(post_as("token-b", "/b/2/initialize", R"({"num_pages":8})"), kTpNoContent);
  EXPECT_EQ(post_as("token-b", "/2/exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  // b's own vLLM state: its probe is b's.
  EXPECT_EQ(post_as("token-b", "/keys/batch_exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  EXPECT_EQ(tenant_lines(),
            "hf3fs_metad_tenant_keys{tenant=\"a\"} 1\n"
            "hf3fs_metad_tenant_keys{tenant=\"b\"} 0\n"
            "hf3fs_metad_tenant_pages{tenant=\"a\",state=\"reserved\"} 1\n"
            "hf3fs_metad_tenant_pages{tenant=\"a\",state=\"bound\"} 1\n"
            "hf3fs_metad_tenant_pages{tenant=\"b\",state=\"reserved\"} 0\n"
            "hf3fs_metad_tenant_pages{tenant=\"b\",state=\"bound\"} 0\n"
            "hf3fs_metad_tenant_requests_total{tenant=\"a\",api=\"vllm\"} 1\n"
            "hf3fs_metad_tenant_requests_total{tenant=\"a\",api=\"sglang\"} 4\n"
            "hf3fs_metad_tenant_requests_total{tenant=\"b\",api=\"vllm\"} 1\n"
            "hf3fs_metad_tenant_requests_total{tenant=\"b\",api=\"sglang\"} 2\n"
            "hf3fs_metad_tenant_lookup_keys_total{tenant=\"a\",result=\"hit\"} 1\n"
            "hf3fs_metad_tenant_lookup_keys_total{tenant=\"a\",result=\"miss\"} 4\n"
            "hf3fs_metad_tenant_lookup_keys_total{tenant=\"b\",result=\"hit\"} 0\n"
            "hf3fs_metad_tenant_lookup_keys_total{tenant=\"b\",result=\"miss\"} 2\n");
  // The unnamed vLLM state is tenant a's (vllm): its rank's pages and keys join a's; b's
  // own state joins b's.
  EXPECT_EQ(status_of(post_as("token-b", "/rank/5/initialize", R"({"num_pages":4})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(status_of(post_as("token-b", "/keys/batch_allocate", R"({"rank":5,"keys":["v","w"]})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(status_of(post_as("token-a", "/rank/5/initialize", R"({"num_pages":4})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(status_of(post_as("token-a", "/keys/batch_allocate", R"({"rank":5,"keys":["v"]})")),
            "HTTP/1.1 200 OK");
  const std::string after = tenant_lines();
  EXPECT_NE(after.find("hf3fs_metad_tenant_pages{tenant=\"a\",state=\"reserved\"} 2\n"),
            std::string::npos)
      << after;
  EXPECT_NE(after.find("hf3fs_metad_tenant_requests_total{tenant=\"a\",api=\"vllm\"} 3\n"),
            std::string::npos)
      << after;
  EXPECT_NE(after.find("hf3fs_metad_tenant_pages{tenant=\"b\",state=\"reserved\"} 2\n"),
            std::string::npos)
      << after;
}

// Two tenants' vLLM states apart on every endpoint: the same rank and the same key are
// two ranks and two keys; nothing one does shows in, or changes, the other's.
TEST_P(TenantsPipeline, EachTenantsVllmStateIsItsOwn) {
  EXPECT_EQ(status_of(post_as("token-a", "/rank/0/initialize", R"({"num_pages":4})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(post_as("token-a", "/keys/batch_allocate", R"({"rank":0,"keys":["k"]})"),
            tp_json("200 OK", R"({"rank":0,"results":[["k",0]]})"));
  EXPECT_EQ(post_as("token-a", "/keys/confirm_write",
                    R"({"rank":0,"confirmations":[["k",0]],"pages_to_release":[]})"),
            kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/keys/batch_exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[true]})"));
  // b probes a's key, asks a's rank: nothing there.
  EXPECT_EQ(post_as("token-b", "/keys/batch_exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  EXPECT_EQ(post_as("token-b", "/keys/get_locations", R"({"rank":0,"keys":["k"]})"),
            tp_json("404 Not Found",
                    R"({"detail":"Failed to get key locations: Rank 0 not initialized"})"));
  EXPECT_EQ(status_of(get_as("token-b", "/rank/0")), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(post_as("token-b", "/keys/batch_allocate", R"({"rank":0,"keys":["k"]})"),
            tp_json("404 Not Found", R"({"detail":"Allocation failed: Rank 0 not initialized"})"));
  // b's own rank 0, of another size: a pool of its own, the same key a page of its own.
  EXPECT_EQ(status_of(post_as("token-b", "/rank/0/initialize", R"({"num_pages":8})")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(post_as("token-b", "/keys/batch_allocate", R"({"rank":0,"keys":["j","k"]})"),
            tp_json("200 OK", R"({"rank":0,"results":[["j",0],["k",1]]})"));
  EXPECT_EQ(post_as("token-b", "/keys/get_locations", R"({"rank":0,"keys":["k"]})"),
            tp_json("200 OK", R"({"locations":[null]})"));
  EXPECT_EQ(get_as("token-b", "/rank/0"),
            tp_json("200 OK", R"({"num_pages":8,"free":6,"reserved":2,"bound":0,"incomplete":0})"));
  EXPECT_EQ(get_as("token-a", "/rank/0"),
            tp_json("200 OK", R"({"num_pages":4,"free":3,"reserved":0,"bound":1,"incomplete":0})"));
  // The admin deletes b's "k" (X-Metad-Tenant names b): a's stays.
  EXPECT_EQ(post_as("token-b", "/keys/confirm_write",
                    R"({"rank":0,"confirmations":[["k",1]],"pages_to_release":[]})"),
            kTpNoContent);
  EXPECT_EQ(post_as("token-b", "/keys/batch_exists", R"({"keys":["k","j"]})"),
            tp_json("200 OK", R"({"exists":[true,false]})"));
  EXPECT_EQ(post_as("token-b", "/keys/delete", R"({"keys":["k"]})"), kTpUnauthorized);
  EXPECT_EQ(admin_post("b", "/keys/delete", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"deleted":1})"));
  EXPECT_EQ(post_as("token-b", "/keys/batch_exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  EXPECT_EQ(post_as("token-a", "/keys/get_locations", R"({"rank":0,"keys":["k"]})"),
            tp_json("200 OK", R"({"locations":[0]})"));
  // Each tenant's /stats is its own.
  const std::string b_stats = get_as("token-b", "/stats");
  EXPECT_NE(b_stats.find(R"("pages_total":8)"), std::string::npos) << b_stats;
  EXPECT_NE(b_stats.find(R"("keys":0)"), std::string::npos) << b_stats;
  const std::string a_stats = get_as("token-a", "/stats");
  EXPECT_NE(a_stats.find(R"("pages_total":4)"), std::string::npos) << a_stats;
  EXPECT_NE(a_stats.find(R"("keys":1)"), std::string::npos) << a_stats;
  EXPECT_EQ(pipeline::check_consistency(n_.state()), "");
  // The admin clears one tenant's state: X-Metad-Tenant names it (none: the unnamed one,
  // the vllm tenant's); a name with no state is a 404.
  EXPECT_EQ(
      admin_post("nobody", "/clear", ""),
      tp_json("404 Not Found",
              R"({"detail":"X-Metad-Tenant: no tenant nobody has vLLM state on this server"})"));
  EXPECT_EQ(admin_post("b", "/clear", ""), kTpNoContent);
  EXPECT_EQ(status_of(get_as("token-b", "/rank/0")), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(post_as("token-a", "/keys/batch_exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[true]})"));
  EXPECT_EQ(admin_post("", "/clear", ""), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/keys/batch_exists", R"({"keys":["k"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  EXPECT_EQ(pipeline::check_consistency(n_.state()), "");
}

// pages=N (tenant_usage::pages): the count every core charges and credits, against what
// the tenant holds (its SGLang pools' in-flight and bound pages on every core, and vLLM's
// ranks' reserved and bound pages for the vllm tenant), read while nothing runs.
std::int64_t tp_held(pipeline::node& nd, const std::string& tenant) {
  std::int64_t held = 0;
  for (const auto& core : nd.core) {
    if (const shard::sglang_pools* pools = core->sg_pools(tenant, false))
      pools->for_each([&](std::int64_t, std::string_view, const shard::sglang_pool& pool) {
        held += static_cast<std::int64_t>(pool.held());
      });
    const auto table = nd.tenants.current();
    const bool holds_unnamed =
        table->vllm_tenant() != nullptr && table->vllm_tenant()->name == tenant;
    core->for_each_space([&](const pipeline::vllm_space& sp) {
      if (sp.id == 0 ? holds_unnamed : sp.tenant == tenant) held += sp.ranks.held_pages();
    });
  }
  return held;
}
std::int64_t tp_counted(pipeline::node& nd, const std::string& tenant) {
  return nd.tenants.usage(tenant).pages.load();
}

TEST_P(TenantsPipeline, PagesQuotaBoundsSglangPagesAcrossCoresAndTenants) {
  publish("a " + tp_hex("token-a") + " pages=3 vllm\nb " + tp_hex("token-b") + " pages=2\n");
  pipeline::node& nd = n_.state();
  const auto exact = [&](std::int64_t a, std::int64_t b) {
    EXPECT_EQ(tp_held(nd, "a"), a);
    EXPECT_EQ(tp_counted(nd, "a"), a);
    EXPECT_EQ(tp_held(nd, "b"), b);
    EXPECT_EQ(tp_counted(nd, "b"), b);
    EXPECT_EQ(pipeline::check_consistency(nd), "");
  };
  const auto reserve = [&](std::string_view token, int rank, std::string_view keys) {
    return post_as(token, fmt::format("/{}/reserve_and_allocate_page_indices", rank),
                   fmt::format(R"({{"keys":{}}})", keys));
  };
  const auto indices = [](std::string_view list) {
    return tp_json("200 OK", fmt::format(R"({{"indices":{}}})", list));
  };
  // Pools on ranks 0 and 1 (two cores of three): the count is the tenant's, not a pool's.
  EXPECT_EQ(post_as("token-a", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/1/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(reserve("token-a", 0, R"(["k1","k2"])"), indices("[[false,3],[false,2]]"));
  EXPECT_EQ(reserve("token-a", 1, R"(["k3"])"), indices("[[false,3]]"));
  exact(3, 0);
  // At the quota: as a full pool answers (pool 1 has free pages, but no bound key).
  EXPECT_EQ(reserve("token-a", 1, R"(["k4"])"), indices("[[false,-1]]"));
  EXPECT_EQ(reserve("token-a", 0, R"(["k4","k5"])"), indices("[[false,-1],[false,-1]]"));
  exact(3, 0);
  // Tenant b: its own quota, a's full one changes nothing for it.
  EXPECT_EQ(post_as("token-b", "/0/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(reserve("token-b", 0, R"(["x","y"])"), indices("[[false,3],[false,2]]"));
  EXPECT_EQ(reserve("token-b", 0, R"(["z"])"), indices("[[false,-1]]"));
  exact(3, 2);
  // A bound key of a's pool 1: at the quota, a reserve there evicts it (a's own key).
  EXPECT_EQ(post_as("token-a", "/1/confirm_write", R"({"written_keys_to_confirm":[["k3",3]]})"),
            kTpNoContent);
  EXPECT_EQ(reserve("token-a", 1, R"(["k3","k4"])"), indices("[[true,3],[false,-1]]"));
  EXPECT_EQ(reserve("token-a", 1, R"(["k4"])"), indices("[[false,3]]"));
  EXPECT_EQ(post_as("token-a", "/1/exists", R"({"keys":["k3"]})"),
            tp_json("200 OK", R"({"exists":[false]})"));
  exact(3, 2);
  // A release (quarantined: no one's) gives one page back; then pool 1 takes a free one.
  EXPECT_EQ(post_as("token-a", "/0/confirm_write",
                    R"({"written_keys_to_confirm":[["k1",3]],"pages_to_release":[2]})"),
            kTpNoContent);
  exact(2, 2);
  EXPECT_EQ(reserve("token-a", 1, R"(["k5"])"), indices("[[false,2]]"));
  exact(3, 2);
  // delete_keys, then clear (the admin's, counted all the same) give pages back.
  EXPECT_EQ(post_as("token-a", "/0/delete_keys", R"({"keys":["k1"]})"), kTpNoContent);
  exact(2, 2);
  EXPECT_EQ(
      post_as("token-a", "/1/confirm_write", R"({"written_keys_to_confirm":[["k4",3],["k5",2]]})"),
      kTpNoContent);
  EXPECT_EQ(post_as("admin", "/a/1/clear", "{}"), kTpNoContent);
  exact(0, 2);
  EXPECT_EQ(reserve("token-a", 1, R"(["k6","k7","k8"])"),
            indices("[[false,3],[false,2],[false,1]]"));
  exact(3, 2);
  // Reservations that expire (--reservation-ttl) are given back by the tick.
  n_.now += std::uint64_t{n_.state().cfg.reservation_ttl_ms} + 1;
  n_.tick();
  exact(0, 0);
  // A reload lowers b's quota below what it holds; raising a's lets it take more.
  const auto pages_given = [](const std::string& answer) {  // of a 200's [false,page]s
    EXPECT_EQ(answer.substr(0, 15), "HTTP/1.1 200 OK");
    std::size_t n = 0;
    for (std::size_t at = answer.find("[false,"); at != std::string::npos;
         at = answer.find("[false,", at + 1))
      n += answer.compare(at + 7, 2, "-1") != 0 ? 1 : 0;
    return n;
  };
  EXPECT_EQ(pages_given(reserve("token-b", 0, R"(["x","y"])")), 2u);
  publish("a " + tp_hex("token-a") + " pages=4 vllm\nb " + tp_hex("token-b") + " pages=1\n");
  EXPECT_EQ(reserve("token-b", 0, R"(["w"])"), indices("[[false,-1]]"));
  EXPECT_EQ(pages_given(reserve("token-a", 0, R"(["a1","a2","a3","a4"])")), 4u);
  EXPECT_EQ(reserve("token-a", 1, R"(["a5"])"), indices("[[false,-1]]"));
  exact(4, 2);
}

TEST_P(TenantsPipeline, PagesQuotaCountsVllmRanksForTheVllmTenant) {
  publish("a " + tp_hex("token-a") + " pages=4 vllm\nb " + tp_hex("token-b") + " pages=1\n");
  pipeline::node& nd = n_.state();
  const auto exact = [&](std::int64_t a) {
    EXPECT_EQ(tp_held(nd, "a"), a);
    EXPECT_EQ(tp_counted(nd, "a"), a);
    EXPECT_EQ(pipeline::check_consistency(nd), "");
  };
  const auto allocate = [&](int rank, std::string_view keys) {
    return post_as("token-a", "/keys/batch_allocate",
                   fmt::format(R"({{"rank":{},"keys":{}}})", rank, keys));
  };
  const auto results = [](int rank, std::string_view list) {
    return tp_json("200 OK", fmt::format(R"({{"rank":{},"results":{}}})", rank, list));
  };
  for (const int rank : {0, 1})
    EXPECT_EQ(status_of(post_as("token-a", fmt::format("/rank/{}/initialize", rank),
                                R"({"num_pages":8})")),
              "HTTP/1.1 200 OK");
  EXPECT_EQ(allocate(0, R"(["k1","k2"])"), results(0, R"([["k1",0],["k2",1]])"));
  EXPECT_EQ(allocate(1, R"(["k1"])"), results(1, R"([["k1",0]])"));
  exact(3);
  // All or nothing: two new keys do not fit in the one page left; hits still answer.
  EXPECT_EQ(allocate(1, R"(["k1","k2","k3"])"), results(1, R"([["k1",0],["k2",-1],["k3",-1]])"));
  exact(3);
  EXPECT_EQ(allocate(1, R"(["k2"])"), results(1, R"([["k2",1]])"));
  EXPECT_EQ(allocate(0, R"(["k3"])"), results(0, R"([["k3",-1]])"));
  exact(4);
  // Its SGLang pools share the quota: none left.
  EXPECT_EQ(post_as("token-a", "/2/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-a", "/2/reserve_and_allocate_page_indices", R"({"keys":["s"]})"),
            tp_json("200 OK", R"({"indices":[[false,-1]]})"));
  // b's quota is its own.
  EXPECT_EQ(post_as("token-b", "/2/initialize", R"({"num_pages":4})"), kTpNoContent);
  EXPECT_EQ(post_as("token-b", "/2/reserve_and_allocate_page_indices", R"({"keys":["s"]})"),
            tp_json("200 OK", R"({"indices":[[false,3]]})"));
  // confirm_write's release gives a page back (on rank 0's core); rank 0 takes it.
  EXPECT_EQ(post_as("token-a", "/keys/confirm_write",
                    R"({"rank":0,"confirmations":[["k1",0]],"pages_to_release":[1]})"),
            kTpNoContent);
  exact(3);
  EXPECT_EQ(allocate(0, R"(["k3"])"), results(0, R"([["k3",2]])"));
  exact(4);
  // Reservations that expire are given back (the tick); so is everything /clear drops.
  n_.now += std::uint64_t{nd.cfg.reservation_ttl_ms} + 1;
  n_.tick();
  // ... and k1, confirmed on rank 0 only, is reclaimed as a stale incomplete key.
  exact(0);
  EXPECT_EQ(allocate(1, R"(["k4","k5","k6"])"), results(1, R"([["k4",0],["k5",1],["k6",2]])"));
  exact(3);
  EXPECT_EQ(post_as("admin", "/clear", ""), kTpNoContent);
  exact(0);
  EXPECT_EQ(post_as("token-a", "/2/reserve_and_allocate_page_indices", R"({"keys":["s"]})"),
            tp_json("200 OK", R"({"indices":[[false,3]]})"));
  exact(1);
}

// --eviction lru: an allocation past pages=N evicts the tenant's least recently used keys
// (vLLM's keys are all the vllm tenant's), then takes the pages they gave back.
TEST(TenantsPagesQuota, VllmEvictsTheTenantsLeastRecentlyUsedKeys) {
  config cfg;
  cfg.tenants_file = "tenants";
  cfg.evict = eviction::lru;
  server_test::memory_node n(cfg, 3);
  auto table = std::make_shared<pipeline::tenant_table>();
  ASSERT_EQ(pipeline::parse_tenants("a " + tp_hex("token-a") + " pages=4 vllm\n",
                                    pipeline::kPatterns, *table),
            "");
  n.state().tenants.publish(std::move(table));
  const auto post = [&](std::string_view path, std::string_view body) {
    return n.send(fmt::format(
        "POST {} HTTP/1.1\r\nauthorization: Bearer token-a\r\ncontent-length: {}\r\n\r\n{}", path,
        body.size(), body));
  };
  for (const int rank : {0, 1})
    EXPECT_EQ(post(fmt::format("/rank/{}/initialize", rank), R"({"num_pages":8})").substr(0, 15),
              "HTTP/1.1 200 OK");
  for (const std::string key : {"k1", "k2"}) {  // k1 first: the least recently used
    const int page = key == "k1" ? 0 : 1;
    for (const int rank : {0, 1}) {
      EXPECT_EQ(
          post("/keys/batch_allocate", fmt::format(R"({{"rank":{},"keys":["{}"]}})", rank, key)),
          tp_json("200 OK",
                  fmt::format(R"({{"rank":{},"results":[["{}",{}]]}})", rank, key, page)));
      EXPECT_EQ(post("/keys/confirm_write",
                     fmt::format(R"({{"rank":{},"confirmations":[["{}",{}]]}})", rank, key, page)),
                kTpNoContent);
    }
    n.now += 1'000;
  }
  EXPECT_EQ(tp_counted(n.state(), "a"), 4);
  n.now += 60'000;  // past the read leases and the settling time
  // k1, the least recently used, goes (from both ranks); k3 takes its page.
  EXPECT_EQ(post("/keys/batch_allocate", R"({"rank":0,"keys":["k3"]})"),
            tp_json("200 OK", R"({"rank":0,"results":[["k3",0]]})"));
  EXPECT_EQ(post("/keys/batch_exists", R"({"keys":["k1","k2"]})"),
            tp_json("200 OK", R"({"exists":[false,true]})"));
  EXPECT_EQ(tp_held(n.state(), "a"), 3);
  EXPECT_EQ(tp_counted(n.state(), "a"), 3);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// The bound: each core counts its first kTenantSeriesMax tenants by name and the rest in
// one row (the default tenant always has its own); a scrape renders the default tenant and
// the first kTenantSeriesMax others by name and sums the rest under tenant="_other".
TEST(TenantMetrics, PastTheBoundTenantsAreSummedUnderOther) {
  pipeline::tenant_counters core;
  for (std::size_t i = 0; i < pipeline::kTenantSeriesMax; ++i)
    ++core.of(fmt::format("t{:04}", i)).requests[1];
  pipeline::tenant_counts& late = core.of("zz");
  EXPECT_EQ(&late, &core.other);
  EXPECT_EQ(&core.of("t0007"), &core.named.at("t0007"));
  EXPECT_EQ(core.named.size(), pipeline::kTenantSeriesMax);
  // The default tenant keeps a row of its own however many names came first.
  const pipeline::tenant_counts* default_row = &core.of("");
  EXPECT_EQ(default_row, &core.named.at(""));
  EXPECT_EQ(core.named.size(), pipeline::kTenantSeriesMax + 1);

  pipeline::metrics_snapshot snap;
  for (std::size_t i = 0; i < pipeline::kTenantSeriesMax + 2; ++i) {
    pipeline::tenant_figures& f = snap.tenants[fmt::format("t{:04}", i)];
    f.keys = 1;
    f.counts.hit = i;
  }
  snap.tenants[""].keys = 5;  // the default tenant's series are kept besides
  std::string out;
  pipeline::render_tenant_metrics(out, snap);
  EXPECT_EQ(snap.tenants.size(), pipeline::kTenantSeriesMax + 1);
  std::size_t keys_lines = 0;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("hf3fs_metad_tenant_keys{")) ++keys_lines;
  EXPECT_EQ(keys_lines, pipeline::kTenantSeriesMax + 2);
  EXPECT_NE(out.find("hf3fs_metad_tenant_keys{tenant=\"\"} 5\n"), std::string::npos);
  EXPECT_NE(out.find("hf3fs_metad_tenant_keys{tenant=\"t0999\"} 1\n"), std::string::npos);
  EXPECT_EQ(out.find("tenant=\"t1000\""), std::string::npos);
  EXPECT_NE(out.find("hf3fs_metad_tenant_keys{tenant=\"_other\"} 2\n"), std::string::npos);
  EXPECT_NE(
      out.find("hf3fs_metad_tenant_lookup_keys_total{tenant=\"_other\",result=\"hit\"} 2001\n"),
      std::string::npos);
  // Within the bound, no _other series.
  pipeline::metrics_snapshot small;
  small.tenants[""].keys = 3;
  out.clear();
  pipeline::render_tenant_metrics(out, small);
  EXPECT_EQ(out.find("{tenant=\"_other\""), std::string::npos);
  EXPECT_NE(out.find("hf3fs_metad_tenant_keys{tenant=\"\"} 3\n"), std::string::npos);
  // A path tenant named _other (without --tenants-file nothing refuses the name): one series.
  small.tenants["_other"].keys = 4;
  out.clear();
  pipeline::render_tenant_metrics(out, small);
  EXPECT_NE(out.find("hf3fs_metad_tenant_keys{tenant=\"_other\"} 4\n"), std::string::npos);
  const std::string other_keys = "hf3fs_metad_tenant_keys{tenant=\"_other\"}";
  EXPECT_EQ(out.find(other_keys), out.rfind(other_keys));  // one series, not two
}

// The bound through the pipeline, without --tenants-file: SGLang's path tenants are any
// client's to name, and a core gives the first kTenantSeriesMax of them rows; the next
// counts under _other, and the default tenant keeps its own.
TEST(TenantMetrics, PathTenantsPastTheBoundCountUnderOther) {
  server_test::memory_node n(config{}, 1);
  const auto exists = [&n](const std::string& path) {
    return n.send(fmt::format("POST {} HTTP/1.1\r\ncontent-length: 2\r\n\r\n{{}}", path));
  };
  for (std::size_t i = 0; i <= pipeline::kTenantSeriesMax; ++i)
    EXPECT_EQ(exists(fmt::format("/t{:04}/0/exists", i)).substr(0, 22), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(exists("/0/exists").substr(0, 22), "HTTP/1.1 404 Not Found");
  const std::string metrics = n.send("GET /metrics HTTP/1.1\r\n\r\n");
  for (const std::string_view tenant : {"", "t0000", "t0999", "_other"})
    EXPECT_NE(metrics.find(fmt::format(
                  "hf3fs_metad_tenant_requests_total{{tenant=\"{}\",api=\"sglang\"}} 1\n", tenant)),
              std::string::npos)
        << tenant;
  EXPECT_EQ(metrics.find("tenant=\"t1000\""), std::string::npos);
}

// Without --tenants-file the operator may still name a tenant's vLLM state (one recovered
// from a run with the file); a name with none is a 404, not the unnamed state's clear.
TEST(TenantsWithoutAFile, XMetadTenantNamesARecoveredStateOrIsA404) {
  config cfg;
  cfg.admin_token = "admin";
  server_test::memory_node n(cfg, 2);
  const auto admin_clear = [&](std::string_view tenant) {
    return n.send(
        fmt::format("POST /clear HTTP/1.1\r\nauthorization: Bearer admin\r\nx-metad-tenant: {}\r\n"
                    "content-length: 0\r\n\r\n",
                    tenant));
  };
  EXPECT_EQ(n.post("/rank/0/initialize", R"({"num_pages":4})"),
            R"({"message":"Rank 0 initialized with 4 pages"})");
  EXPECT_EQ(admin_clear("b"),
            tp_json("404 Not Found",
                    R"({"detail":"X-Metad-Tenant: no tenant b has vLLM state on this server"})"));
  n.state().tenants.space_of("b");  // as recovery makes it for b's records
  EXPECT_EQ(admin_clear("b"), kTpNoContent);
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})");
}

}  // namespace
