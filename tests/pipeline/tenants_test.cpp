// The tenants file (--tenants-file, pipeline/tenants.hpp): every kind of bad line refused
// naming its line, comments and blank lines, two hashes a tenant, the digest lookup, and
// the registry's versions and usage across reloads.
#include "pipeline/tenants.hpp"

#include <gtest/gtest.h>

#include <string>

#include "pipeline/routes.hpp"

namespace metad::pipeline {
namespace {

// SHA-256("abc") (FIPS 180-2's example) and two other digests, in hex.
const std::string kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
const std::string kH1(64, '1');
const std::string kH2(64, 'b');

std::string tenants_error(const std::string& text) {
  tenant_table table;
  return parse_tenants(text, kPatterns, table);
}

tenant_table tenants_parsed(const std::string& text) {
  tenant_table table;
  const std::string error = parse_tenants(text, kPatterns, table);
  EXPECT_EQ(error, "") << text;
  return table;
}

token_digest digest_of_hex(const std::string& hex) {
  token_digest d{};
  for (std::size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return d;
}

TEST(TenantsFile, Sha256IsOpenSslsSha256) {
  EXPECT_EQ(token_sha256("abc"), digest_of_hex(kAbc));
  EXPECT_NE(token_sha256("abd"), digest_of_hex(kAbc));
  // sha256sum of the empty input.
  EXPECT_EQ(token_sha256(""),
            digest_of_hex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
}

TEST(TenantsFile, CommentsBlankLinesAndEveryField) {
  const tenant_table t = tenants_parsed(
      "# tenants of the cluster\n"
      "\n"
      "   \t \n"
      "  # an indented comment\n"
      "team_a " +
      kAbc +
      " ranks=8 vllm pages=4096   # the vLLM engines\n"
      "Team-B.2\t" +
      kH1 + "," + kH2 +
      "\r\n"
      "_c " +
      std::string(64, 'C') +
      " ranks=0\n"  // upper-case hex too
      "# last line without a newline\n"
      "d " +
      std::string(64, 'd'));
  ASSERT_EQ(t.tenants.size(), 4u);
  EXPECT_EQ(t.tenants[0].name, "team_a");
  EXPECT_EQ(t.tenants[0].line, 5);
  EXPECT_EQ(t.tenants[0].ranks, 8);
  EXPECT_EQ(t.tenants[0].pages, 4096);
  EXPECT_TRUE(t.tenants[0].vllm);
  EXPECT_EQ(t.tenants[1].name, "Team-B.2");
  EXPECT_EQ(t.tenants[1].hashes.size(), 2u);
  EXPECT_EQ(t.tenants[1].ranks, -1);
  EXPECT_EQ(t.tenants[1].pages, -1);  // no quota
  EXPECT_FALSE(t.tenants[1].vllm);
  EXPECT_EQ(t.tenants[2].ranks, 0);
  EXPECT_EQ(t.tenants[3].line, 9);
  ASSERT_NE(t.vllm_tenant(), nullptr);
  EXPECT_EQ(t.vllm_tenant()->name, "team_a");
  // Lookup by the digest of the presented token; both of a rotating tenant's hashes.
  EXPECT_EQ(t.find(token_sha256("abc")), &t.tenants[0]);
  EXPECT_EQ(t.find(digest_of_hex(kH1)), &t.tenants[1]);
  EXPECT_EQ(t.find(digest_of_hex(kH2)), &t.tenants[1]);
  EXPECT_EQ(t.find(digest_of_hex(std::string(64, 'c'))), &t.tenants[2]);
  EXPECT_EQ(t.find(token_sha256("abd")), nullptr);
  EXPECT_EQ(t.find(token_sha256(kAbc)), nullptr);  // the hash is not the token
}

TEST(TenantsFile, AnEmptyFileHasNoTenants) {
  for (const std::string text : {"", "\n\n", "# nobody yet\n"}) {
    const tenant_table t = tenants_parsed(text);
    EXPECT_TRUE(t.tenants.empty());
    EXPECT_EQ(t.vllm_tenant(), nullptr);
  }
}

TEST(TenantsFile, BadNames) {
  const std::string shape =
      " is not a tenant name (a letter or '_', then up to 63 of A-Za-z0-9_.-)";
  EXPECT_EQ(tenants_error("# x\n9lives " + kAbc + "\n"), "line 2: '9lives'" + shape);
  EXPECT_EQ(tenants_error("-a " + kAbc), "line 1: '-a'" + shape);
  EXPECT_EQ(tenants_error(".a " + kAbc), "line 1: '.a'" + shape);
  EXPECT_EQ(tenants_error("a/b " + kAbc), "line 1: 'a/b'" + shape);
  EXPECT_EQ(tenants_error("a:b " + kAbc), "line 1: 'a:b'" + shape);
  EXPECT_EQ(tenants_error("t\xc3\xa9 " + kAbc), "line 1: 't\xc3\xa9'" + shape);
  const std::string longest = "a" + std::string(63, 'b');
  EXPECT_EQ(tenants_parsed(longest + " " + kAbc).tenants.at(0).name, longest);
  EXPECT_EQ(tenants_error(longest + "c " + kAbc), "line 1: '" + longest + "c'" + shape);
  // A name that starts another route could not be a path's tenant segment.
  for (const std::string word :
       {"rank", "keys", "clear", "health", "metrics", "stats", "ready", "status.json"})
    EXPECT_EQ(tenants_error(word + " " + kAbc),
              "line 1: '" + word + "' is not a tenant name: /" + word + "/... is another route")
        << word;
  // /metrics' overflow label.
  EXPECT_EQ(tenants_error("_other " + kAbc),
            "line 1: '_other' is not a tenant name: /metrics sums the tenants past its first "
            "1000 under tenant=\"_other\"");
  EXPECT_EQ(tenants_parsed("_others " + kAbc).tenants.at(0).name, "_others");
}

TEST(TenantsFile, BadHashes) {
  const std::string how =
      " is not a SHA-256 in hex (64 hex digits, as printf %s \"$TOKEN\" | "
      "sha256sum prints)";
  EXPECT_EQ(tenants_error("a"),
            "line 1: tenant a has no SHA-256 of its token (NAME "
            "SHA256[,SHA256] [ranks=N] [pages=N] [vllm])");
  EXPECT_EQ(tenants_error("a  # a comment is no hash"),
            "line 1: tenant a has no SHA-256 of its token (NAME SHA256[,SHA256] [ranks=N] "
            "[pages=N] [vllm])");
  EXPECT_EQ(tenants_error("a " + kAbc.substr(1)), "line 1: '" + kAbc.substr(1) + "'" + how);
  EXPECT_EQ(tenants_error("a " + kAbc + "0"), "line 1: '" + kAbc + "0'" + how);
  EXPECT_EQ(tenants_error("a " + std::string(63, 'a') + "g"),
            "line 1: '" + std::string(63, 'a') + "g'" + how);
  EXPECT_EQ(tenants_error("a s3cret-token"), "line 1: 's3cret-token'" + how);
  EXPECT_EQ(tenants_error("a " + kAbc + ","), "line 1: ''" + how);
  EXPECT_EQ(tenants_error("a ," + kAbc), "line 1: ''" + how);
  EXPECT_EQ(tenants_error("a " + kAbc + ",zz"), "line 1: 'zz'" + how);
  EXPECT_EQ(tenants_error("a " + kAbc + "," + kAbc),
            "line 1: tenant a names the same SHA-256 twice");
  EXPECT_EQ(tenants_error("a " + kAbc + "," + kH1 + "," + kH2),
            "line 1: tenant a has more than two SHA-256s (two let a token be rotated)");
  // A long bad field is shown cut.
  const std::string huge(300, 'x');
  EXPECT_EQ(tenants_error("a " + huge), "line 1: '" + std::string(80, 'x') + "...'" + how);
}

TEST(TenantsFile, BadFields) {
  const std::string a = "a " + kAbc + " ";
  const std::string range = ": ranks= takes an integer in [0, 16777216]";
  EXPECT_EQ(tenants_error(a + "ranks="), "line 1: 'ranks='" + range);
  EXPECT_EQ(tenants_error(a + "ranks=-1"), "line 1: 'ranks=-1'" + range);
  EXPECT_EQ(tenants_error(a + "ranks=x"), "line 1: 'ranks=x'" + range);
  EXPECT_EQ(tenants_error(a + "ranks=1e3"), "line 1: 'ranks=1e3'" + range);
  EXPECT_EQ(tenants_error(a + "ranks=16777217"), "line 1: 'ranks=16777217'" + range);
  EXPECT_EQ(tenants_error(a + "ranks=99999999999999999999"),
            "line 1: 'ranks=99999999999999999999'" + range);
  EXPECT_EQ(tenants_parsed(a + "ranks=16777216").tenants.at(0).ranks, 16777216);
  EXPECT_EQ(tenants_error(a + "ranks=1 ranks=2"), "line 1: ranks= is given twice");
  EXPECT_EQ(tenants_error(a + "vllm vllm"), "line 1: vllm is given twice");
  // pages=N: 0 up to 2^48 (a pool's largest), once.
  const std::string pages_range = ": pages= takes an integer in [0, 281474976710656]";
  for (const std::string bad : {"pages=", "pages=abc", "pages=-1", "pages=+1", "pages=1.5",
                                "pages=281474976710657", "pages=99999999999999999999"})
    EXPECT_EQ(tenants_error(a + bad), "line 1: '" + bad + "'" + pages_range);
  EXPECT_EQ(tenants_error(a + "pages=1 pages=1"), "line 1: pages= is given twice");
  EXPECT_EQ(tenants_error(a + "pages=1 ranks=2 pages=3"), "line 1: pages= is given twice");
  EXPECT_EQ(tenants_parsed(a + "pages=0").tenants.at(0).pages, 0);
  EXPECT_EQ(tenants_parsed(a + "pages=281474976710656").tenants.at(0).pages, std::int64_t{1} << 48);
  const tenant_table both = tenants_parsed(a + "pages=100 ranks=2");
  EXPECT_EQ(both.tenants.at(0).pages, 100);
  EXPECT_EQ(both.tenants.at(0).ranks, 2);
  EXPECT_EQ(tenants_error(a + "PAGES=1"),
            "line 1: unknown field 'PAGES=1' (NAME SHA256[,SHA256] [ranks=N] [pages=N] [vllm])");
  EXPECT_EQ(tenants_error(a + "RANKS=1"),
            "line 1: unknown field 'RANKS=1' (NAME SHA256[,SHA256] [ranks=N] [pages=N] [vllm])");
  EXPECT_EQ(tenants_error(a + "vLLM"),
            "line 1: unknown field 'vLLM' (NAME SHA256[,SHA256] [ranks=N] [pages=N] [vllm])");
  EXPECT_EQ(tenants_error(a + "-"),  // sha256sum's file name, pasted with the hash
            "line 1: unknown field '-' (NAME SHA256[,SHA256] [ranks=N] [pages=N] [vllm])");
}

TEST(TenantsFile, DuplicatesAcrossLines) {
  EXPECT_EQ(tenants_error("a " + kAbc + "\n\n# c\nb " + kH1 + "\na " + kH2 + "\n"),
            "line 5: tenant a is named on line 1 already");
  // Names are case-sensitive, as the path's tenant segment.
  EXPECT_EQ(tenants_parsed("a " + kAbc + "\nA " + kH1).tenants.size(), 2u);
  EXPECT_EQ(tenants_error("a " + kAbc + "\nb " + kH1 + "," + kAbc),
            "line 2: this SHA-256 is tenant a's already (line 1): a token belongs to one tenant");
  // The same digest in either case of hex.
  std::string upper = kAbc;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(tenants_error("a " + kAbc + "\nb " + upper),
            "line 2: this SHA-256 is tenant a's already (line 1): a token belongs to one tenant");
  EXPECT_EQ(
      tenants_error("a " + kAbc + " vllm\nb " + kH1 + " vllm"),
      "line 2: vllm: tenant a (line 1) holds the unnamed vLLM state already; one tenant at most");
  // The first error is the one reported.
  EXPECT_EQ(tenants_error("a " + kAbc + "\n1 x\na y"),
            "line 2: '1' is not a tenant name (a "
            "letter or '_', then up to 63 of "
            "A-Za-z0-9_.-)");
}

TEST(TenantsFile, ARefusedParseLeavesNoTenants) {
  tenant_table table;
  EXPECT_EQ(parse_tenants("a " + kAbc, kPatterns, table), "");
  EXPECT_NE(parse_tenants("a " + kAbc + "\nb x", kPatterns, table), "");
  // Whatever a failed parse left, the loader never publishes it (server.cpp); a good
  // parse starts from nothing.
  EXPECT_EQ(parse_tenants("b " + kH1, kPatterns, table), "");
  ASSERT_EQ(table.tenants.size(), 1u);
  EXPECT_EQ(table.find(token_sha256("abc")), nullptr);
}

TEST(TenantRegistry, VersionsAndUsageAcrossReloads) {
  tenant_registry registry;
  EXPECT_FALSE(registry.enabled());
  EXPECT_EQ(registry.version(), 0u);
  EXPECT_EQ(registry.current(), nullptr);

  auto first = std::make_shared<tenant_table>(tenants_parsed("a " + kAbc + "\nb " + kH1));
  registry.publish(first);
  EXPECT_TRUE(registry.enabled());
  EXPECT_EQ(registry.version(), 1u);
  const auto one = registry.current();
  ASSERT_EQ(one->version, 1u);
  tenant_usage* a_usage = one->tenants[0].usage;
  ASSERT_NE(a_usage, nullptr);
  a_usage->sg_ranks = 3;
  a_usage->pages = 40;

  // b removed, c added: a keeps its usage record; b's stays for when it comes back.
  registry.publish(std::make_shared<tenant_table>(tenants_parsed("c " + kH2 + "\na " + kAbc)));
  const auto two = registry.current();
  EXPECT_EQ(registry.version(), 2u);
  EXPECT_EQ(two->version, 2u);
  EXPECT_EQ(two->tenants[1].usage, a_usage);
  EXPECT_EQ(two->tenants[1].usage->sg_ranks.load(), 3);
  EXPECT_EQ(two->tenants[1].usage->pages.load(), 40);
  EXPECT_NE(two->tenants[0].usage, a_usage);
  EXPECT_EQ(&registry.usage("b"), one->tenants[1].usage);
  // The table a core still holds stays valid after the swap.
  EXPECT_EQ(one->find(digest_of_hex(kH1))->name, "b");
  EXPECT_EQ(two->find(digest_of_hex(kH1)), nullptr);

  // A recount (restart, promotion) sets both counts from the state, 0 for the rest.
  registry.usage("b").pages = 7;
  registry.recount({{"a", 1}}, {{"c", 12}, {"d", 5}});
  EXPECT_EQ(a_usage->sg_ranks.load(), 1);
  EXPECT_EQ(a_usage->pages.load(), 0);
  EXPECT_EQ(registry.usage("b").pages.load(), 0);
  EXPECT_EQ(two->tenants[0].usage->pages.load(), 12);
  EXPECT_EQ(registry.usage("d").pages.load(), 5);  // made by the recount
}

}  // namespace
}  // namespace metad::pipeline
