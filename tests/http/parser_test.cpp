#include "http/parser.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace metad::http {
namespace {

// A request copied out of the parser, so that outcomes can be compared after the fact.
struct seen_request {
  method verb = method::other;
  std::string target;
  bool http_1_0 = false;
  bool keep_alive = true;
  std::string body;
  bool operator==(const seen_request&) const = default;
};

std::ostream& operator<<(std::ostream& os, const seen_request& r) {
  return os << "{verb " << static_cast<int>(r.verb) << ", target '" << r.target << "', 1.0 "
            << r.http_1_0 << ", keep-alive " << r.keep_alive << ", body '" << r.body << "'}";
}

// Everything the parser said about one input.
struct outcome {
  std::vector<seen_request> requests;
  parse_error error = parse_error::none;
  bool mid_request = false;  // after the last byte
  bool operator==(const outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const outcome& o) {
  os << "{requests [";
  for (const auto& r : o.requests) os << r << ' ';
  return os << "], error " << static_cast<int>(o.error) << ", mid_request " << o.mid_request << '}';
}

void feed(parser& p, std::string_view bytes, std::size_t min_bytes = 16 * 1024) {
  while (!bytes.empty()) {
    const std::span<char> space = p.read_space(min_bytes);
    EXPECT_GE(space.size(), min_bytes);
    const std::size_t n = std::min(space.size(), bytes.size());
    std::memcpy(space.data(), bytes.data(), n);
    p.commit(n);
    bytes.remove_prefix(n);
  }
}

// Reads the padding after the body: ASan reports it if it is not inside the buffer.
void expect_padding_readable(std::string_view body) {
  const volatile char* padding = body.data() + body.size();
  char sum = 0;
  for (std::size_t i = 0; i < body_padding_bytes; ++i) sum = static_cast<char>(sum ^ padding[i]);
  (void)sum;
}

// Pulls every ready request; false once the parser failed.
bool drain(parser& p, outcome& out) {
  for (;;) {
    switch (p.next()) {
      case parse_status::ready: {
        const request& r = p.current();
        expect_padding_readable(r.body);
        out.requests.push_back(
            {r.verb, std::string(r.target), r.http_1_0, r.keep_alive, std::string(r.body)});
        EXPECT_FALSE(p.mid_request());
        p.consume();
        break;
      }
      case parse_status::error:
        out.error = p.error();
        EXPECT_EQ(p.next(), parse_status::error);  // the parser stays dead
        return false;
      case parse_status::need_more:
        return true;
    }
  }
}

// Feeds `input` cut at `cuts` (ascending offsets), draining after every piece.
outcome run(std::string_view input, const std::vector<std::size_t>& cuts, limits lim = {},
            std::size_t min_bytes = 16 * 1024) {
  parser p(lim);
  outcome out;
  std::size_t from = 0;
  auto piece = [&](std::size_t to) {
    feed(p, input.substr(from, to - from), min_bytes);
    from = to;
    return drain(p, out);
  };
  bool alive = true;
  for (std::size_t cut : cuts) {
    if (alive && cut > from) alive = piece(cut);
  }
  if (alive) alive = piece(input.size());
  out.mid_request = alive && p.mid_request();
  return out;
}

outcome run_whole(std::string_view input, limits lim = {}) { return run(input, {}, lim); }

outcome run_byte_by_byte(std::string_view input, limits lim = {}) {
  std::vector<std::size_t> cuts(input.size());
  for (std::size_t i = 0; i < cuts.size(); ++i) cuts[i] = i;
  return run(input, cuts, lim, 1);
}

// The outcome of `input` must not depend on how its bytes arrive.
void expect_split_invariant(std::string_view input, const outcome& whole, limits lim = {}) {
  for (std::size_t cut = 1; cut < input.size(); ++cut) {
    ASSERT_EQ(run(input, {cut}, lim), whole) << "split at " << cut;
  }
  ASSERT_EQ(run_byte_by_byte(input, lim), whole) << "byte by byte";
}

seen_request get(std::string target, bool keep_alive = true) {
  return {method::get, std::move(target), false, keep_alive, ""};
}
seen_request post(std::string target, std::string body, bool keep_alive = true) {
  return {method::post, std::move(target), false, keep_alive, std::move(body)};
}

struct parse_case {
  std::string name;
  std::string input;
  std::vector<seen_request> requests;
  parse_error error = parse_error::none;
  limits lim = {};
  bool mid_request = false;  // the input ends inside a request
};

std::ostream& operator<<(std::ostream& os, const parse_case& c) { return os << c.name; }

void check(const parse_case& c) {
  outcome expected{c.requests, c.error, c.mid_request};
  const outcome whole = run_whole(c.input, c.lim);
  ASSERT_EQ(whole, expected) << c.name;
  expect_split_invariant(c.input, whole, c.lim);
}

class ParserGood : public ::testing::TestWithParam<parse_case> {};
class ParserBad : public ::testing::TestWithParam<parse_case> {};
class ParserLimits : public ::testing::TestWithParam<parse_case> {};

TEST_P(ParserGood, ParsesTheSameWhateverTheSplit) { check(GetParam()); }
TEST_P(ParserBad, FailsTheSameWhateverTheSplit) { check(GetParam()); }
TEST_P(ParserLimits, EnforcesLimitsWhateverTheSplit) { check(GetParam()); }

std::string case_name(const ::testing::TestParamInfo<parse_case>& info) { return info.param.name; }

const std::string json = R"({"keys":["abc","def"]})";
const std::string json_length = std::to_string(json.size());

INSTANTIATE_TEST_SUITE_P(
    Table, ParserGood,
    ::testing::Values(
        parse_case{"SimpleGet", "GET /rank/3 HTTP/1.1\r\nHost: x\r\n\r\n", {get("/rank/3")}},
        parse_case{"NoHeaders", "GET / HTTP/1.1\r\n\r\n", {get("/")}},
        parse_case{"PostWithContentLength",
                   "POST /keys/batch_exists HTTP/1.1\r\nHost: localhost:18000\r\n"
                   "Content-Type: application/json\r\nContent-Length: " +
                       json_length + "\r\n\r\n" + json,
                   {post("/keys/batch_exists", json)}},
        parse_case{"ZeroContentLength",
                   "POST /clear HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                   {post("/clear", "")}},
        parse_case{"Http10ClosesByDefault",
                   "GET /a HTTP/1.0\r\n\r\n",
                   {{method::get, "/a", true, false, ""}}},
        parse_case{"Http10KeepAliveAsked",
                   "GET /a HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
                   {{method::get, "/a", true, true, ""}}},
        parse_case{"Http10KeepAliveAndClose",
                   "GET /a HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
                   {{method::get, "/a", true, false, ""}}},
        parse_case{
            "ConnectionClose", "GET / HTTP/1.1\r\nConnection: close\r\n\r\n", {get("/", false)}},
        parse_case{"ConnectionTokenList",
                   "GET / HTTP/1.1\r\nConnection: Upgrade ,\tCLOSE\r\n\r\n",
                   {get("/", false)}},
        parse_case{"ConnectionCloseOnSecondLine",
                   "GET / HTTP/1.1\r\nConnection: te\r\nConnection: close\r\n\r\n",
                   {get("/", false)}},
        parse_case{"ConnectionTokenIsNotASubstring",
                   "GET / HTTP/1.1\r\nConnection: closed, x-close\r\n\r\n",
                   {get("/")}},
        parse_case{
            "ConnectionKeepAlive", "GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n", {get("/")}},
        parse_case{"QueryIsStripped",
                   "GET /keys/batch_exists?x=1&y=%20 HTTP/1.1\r\n\r\n",
                   {get("/keys/batch_exists")}},
        parse_case{"EmptyQueryIsStripped", "GET /? HTTP/1.1\r\n\r\n", {get("/")}},
        // RFC 9112 3.2.2: a server must accept the absolute-form (what proxies get).
        parse_case{
            "AbsoluteFormTarget", "GET http://h:18000/rank/3?x HTTP/1.1\r\n\r\n", {get("/rank/3")}},
        parse_case{
            "AbsoluteFormSchemeIsCaseInsensitive", "GET HTTPS://h/x HTTP/1.1\r\n\r\n", {get("/x")}},
        parse_case{"AbsoluteFormWithoutPathIsTheRoot", "GET http://h HTTP/1.1\r\n\r\n", {get("/")}},
        parse_case{"AbsoluteFormWithOnlyAQueryIsTheRoot",
                   "GET http://h?a=/b HTTP/1.1\r\n\r\n",
                   {get("/")}},
        parse_case{"HeaderNamesAreCaseInsensitive",
                   "POST /x HTTP/1.1\r\nCONTENT-length: 3\r\n\r\nabc",
                   {post("/x", "abc")}},
        parse_case{"ValueWhitespaceIsTrimmed",
                   "POST /x HTTP/1.1\r\nContent-Length: \t 3 \t\r\n\r\nabc",
                   {post("/x", "abc")}},
        parse_case{"NoSpaceAfterColon",
                   "POST /x HTTP/1.1\r\nContent-Length:3\r\n\r\nabc",
                   {post("/x", "abc")}},
        parse_case{"IdenticalContentLengthsAreAccepted",
                   "POST /x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 003\r\n\r\nabc",
                   {post("/x", "abc")}},
        parse_case{
            "EmptyHeaderValue", "GET / HTTP/1.1\r\nX-Empty:\r\nX-Blank:   \r\n\r\n", {get("/")}},
        parse_case{"ObsTextInValue", "GET / HTTP/1.1\r\nX-Name: caf\xc3\xa9\r\n\r\n", {get("/")}},
        parse_case{"TabInValue", "GET / HTTP/1.1\r\nX-Name: a\tb\r\n\r\n", {get("/")}},
        parse_case{"LeadingEmptyLinesAreSkipped", "\r\n\r\nGET / HTTP/1.1\r\n\r\n", {get("/")}},
        parse_case{"TrailingEmptyLineAfterBodyIsSkipped",
                   "POST /x HTTP/1.1\r\nContent-Length: 1\r\n\r\nz\r\n",
                   {post("/x", "z")}},
        parse_case{"MethodsMapToTheEnum",
                   "HEAD / HTTP/1.1\r\n\r\nPUT / HTTP/1.1\r\n\r\nDELETE / HTTP/1.1\r\n\r\n"
                   "PATCH / HTTP/1.1\r\n\r\nOPTIONS / HTTP/1.1\r\n\r\nBREW / HTTP/1.1\r\n\r\n"
                   "get / HTTP/1.1\r\n\r\n",
                   {{method::head, "/", false, true, ""},
                    {method::put, "/", false, true, ""},
                    {method::delete_, "/", false, true, ""},
                    {method::patch, "/", false, true, ""},
                    {method::options, "/", false, true, ""},
                    {method::other, "/", false, true, ""},
                    {method::other, "/", false, true, ""}}},
        parse_case{"ChunkedBodyIsDecoded",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n",
                   {post("/x", "Wikipedia")}},
        parse_case{"ChunkedIsCaseInsensitiveAndTrimmed",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n"
                   "a\r\n0123456789\r\nA\r\nabcdefghij\r\n0\r\n\r\n",
                   {post("/x", "0123456789abcdefghij")}},
        parse_case{"ChunkExtensionsAreIgnored",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "3;name=value\r\nabc\r\n2 ; q=\"x y\"\r\nde\r\n0;last\r\n\r\n",
                   {post("/x", "abcde")}},
        parse_case{"ChunkSizeWithLeadingZeros",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "0003\r\nabc\r\n000\r\n\r\n",
                   {post("/x", "abc")}},
        parse_case{"TrailersAreSkipped",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "3\r\nabc\r\n0\r\nX-Checksum: 1234\r\nX-Other:\r\n\r\n",
                   {post("/x", "abc")}},
        parse_case{"EmptyChunkedBody",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                   {post("/x", "")}},
        parse_case{"ChunkedBodyMayHoldCrlf",
                   "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "4\r\n\r\n\r\n\r\n0\r\n\r\n",
                   {post("/x", "\r\n\r\n")}},
        parse_case{"Http10Chunked",
                   "POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nq\r\n0\r\n\r\n",
                   {{method::post, "/x", true, false, "q"}}},
        parse_case{"ExpectWithBodyPresent",
                   "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
                   {post("/x", "hi")}},
        parse_case{"BodyOnGetIsKept",
                   "GET /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                   {{method::get, "/x", false, true, "hi"}}},
        parse_case{"PipelinedMixedFraming",
                   "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                   "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n"
                   "GET /c?q HTTP/1.1\r\nConnection: close\r\n\r\n",
                   {post("/a", "abc"), post("/b", "de"), get("/c", false)}}),
    case_name);

parse_case bad(std::string name, std::string input, parse_error error) {
  return {std::move(name), std::move(input), {}, error};
}

std::string chunked(std::string encoded_body) {
  return "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + encoded_body;
}
std::string with_header(std::string header_line) {
  return "POST /x HTTP/1.1\r\n" + header_line + "\r\n\r\n";
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParserBad,
    ::testing::Values(
        bad("OnlyMethod", "GET\r\n\r\n", parse_error::bad_request_line),
        bad("NoVersion", "GET /\r\n\r\n", parse_error::bad_request_line),
        bad("ExtraPart", "GET / HTTP/1.1 x\r\n\r\n", parse_error::bad_request_line),
        bad("DoubleSpace", "GET  / HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("LeadingSpace", " GET / HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("MethodNotAToken", "G(T / HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("TargetWithoutSlash", "GET x HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("AbsoluteFormOfAnotherScheme", "GET ftp://h/x HTTP/1.1\r\n\r\n",
            parse_error::bad_request_line),
        bad("AbsoluteFormWithoutAuthority", "GET http:///x HTTP/1.1\r\n\r\n",
            parse_error::bad_request_line),
        bad("AuthorityFormTarget", "GET h:80 HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("AsteriskTarget", "OPTIONS * HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("ControlInTarget", "GET /a\x01 HTTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("NotHttp", "GET / FTP/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("LowercaseHttp", "GET / http/1.1\r\n\r\n", parse_error::bad_request_line),
        bad("VersionWithoutMinor", "GET / HTTP/1\r\n\r\n", parse_error::bad_request_line),
        bad("BareLfRequestLine", "GET / HTTP/1.1\n\r\n", parse_error::bad_request_line),
        bad("BinaryGarbage", std::string("\x16\x03\x01\x02\x00\x01\n", 7),
            parse_error::bad_request_line),
        bad("Http2", "GET / HTTP/2.0\r\n\r\n", parse_error::bad_version),
        bad("Http12", "GET / HTTP/1.2\r\n\r\n", parse_error::bad_version),
        bad("Http09", "GET / HTTP/0.9\r\n\r\n", parse_error::bad_version),
        bad("Http2Preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", parse_error::bad_version),
        bad("HeaderWithoutColon", with_header("NoColon"), parse_error::bad_header),
        bad("SpaceBeforeColon", with_header("Content-Length : 1"), parse_error::bad_header),
        bad("EmptyHeaderName", with_header(": v"), parse_error::bad_header),
        bad("ObsFold", with_header("X: a\r\n  b"), parse_error::bad_header),
        bad("TabInName", with_header("X\tY: a"), parse_error::bad_header),
        bad("BareLfInHeaders", "POST /x HTTP/1.1\r\nX: a\nY: b\r\n\r\n", parse_error::bad_header),
        bad("BareLfEndsHeaders", "POST /x HTTP/1.1\r\nX: a\r\n\n", parse_error::bad_header),
        bad("ControlInValue", with_header("X: a\x01z"), parse_error::bad_header),
        bad("CrInValue", with_header("X: a\rz"), parse_error::bad_header),
        bad("ContentLengthLetters", with_header("Content-Length: abc"),
            parse_error::bad_content_length),
        bad("ContentLengthEmpty", with_header("Content-Length:"), parse_error::bad_content_length),
        bad("ContentLengthNegative", with_header("Content-Length: -1"),
            parse_error::bad_content_length),
        bad("ContentLengthPlus", with_header("Content-Length: +1"),
            parse_error::bad_content_length),
        bad("ContentLengthInnerSpace", with_header("Content-Length: 1 2"),
            parse_error::bad_content_length),
        bad("ContentLengthList", with_header("Content-Length: 5, 5"),
            parse_error::bad_content_length),
        bad("ContentLengthHex", with_header("Content-Length: 0x10"),
            parse_error::bad_content_length),
        bad("ContentLengthOverflow", with_header("Content-Length: 18446744073709551616"),
            parse_error::bad_content_length),
        bad("ContentLengthsDiffer", with_header("Content-Length: 1\r\nContent-Length: 2"),
            parse_error::bad_content_length),
        bad("LengthAndChunked", with_header("Content-Length: 1\r\nTransfer-Encoding: chunked"),
            parse_error::length_and_chunked),
        bad("ChunkedAndLength", with_header("Transfer-Encoding: chunked\r\nContent-Length: 0"),
            parse_error::length_and_chunked),
        bad("LengthAndGzip", with_header("Transfer-Encoding: gzip\r\nContent-Length: 1"),
            parse_error::length_and_chunked),
        bad("Gzip", with_header("Transfer-Encoding: gzip"), parse_error::unknown_coding),
        bad("GzipThenChunked", with_header("Transfer-Encoding: gzip, chunked"),
            parse_error::unknown_coding),
        bad("ChunkedThenGzip", with_header("Transfer-Encoding: chunked, gzip"),
            parse_error::unknown_coding),
        bad("Identity", with_header("Transfer-Encoding: identity"), parse_error::unknown_coding),
        bad("EmptyCoding", with_header("Transfer-Encoding:"), parse_error::unknown_coding),
        bad("TwoCodingLines", with_header("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked"),
            parse_error::unknown_coding),
        bad("ChunkedTwice", with_header("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked"),
            parse_error::unknown_coding),
        bad("ChunkSizeNotHex", chunked("x\r\n"), parse_error::bad_chunk),
        bad("ChunkSizeNegative", chunked("-1\r\n"), parse_error::bad_chunk),
        bad("ChunkSizeEmpty", chunked("\r\n"), parse_error::bad_chunk),
        bad("ChunkSizeJunk", chunked("4 x\r\nWiki\r\n0\r\n\r\n"), parse_error::bad_chunk),
        bad("ChunkSizeBareLf", chunked("4\nWiki\r\n0\r\n\r\n"), parse_error::bad_chunk),
        bad("ChunkDataTooLong", chunked("4\r\nWikiX\r\n0\r\n\r\n"), parse_error::bad_chunk),
        bad("ChunkDataCrWithoutLf", chunked("4\r\nWiki\rX0\r\n\r\n"), parse_error::bad_chunk),
        bad("ChunkExtensionControl", chunked("4;a\x01\r\nWiki\r\n0\r\n\r\n"),
            parse_error::bad_chunk),
        bad("TrailerWithoutColon", chunked("0\r\nNoColon\r\n\r\n"), parse_error::bad_chunk),
        bad("TrailerBareLf", chunked("0\r\nX: 1\n\r\n"), parse_error::bad_chunk),
        bad("LastChunkBareLf", chunked("0\r\n\n"), parse_error::bad_chunk),
        parse_case{"RequestsBeforeTheErrorAreDelivered",
                   "GET / HTTP/1.1\r\n\r\nGET\r\n\r\n",
                   {get("/")},
                   parse_error::bad_request_line}),
    case_name);

constexpr limits small{.header_bytes_max = 128, .body_bytes_max = 64};

// A GET whose request line + headers + blank line is exactly `size` bytes.
std::string head_of_size(std::size_t size) {
  const std::string start = "GET / HTTP/1.1\r\nX: ";
  return start + std::string(size - start.size() - 4, 'a') + "\r\n\r\n";
}
std::string body_of_size(std::size_t size, std::string_view method_line = "POST /x HTTP/1.1") {
  return std::string(method_line) + "\r\nContent-Length: " + std::to_string(size) + "\r\n\r\n" +
         std::string(size, 'b');
}
std::string chunk(std::size_t size, char fill = 'c') {
  char hex[32];
  std::snprintf(hex, sizeof hex, "%zx", size);
  return std::string(hex) + "\r\n" + std::string(size, fill) + "\r\n";
}

parse_case limit_case(std::string name, std::string input, std::vector<seen_request> requests,
                      parse_error error = parse_error::none) {
  return {std::move(name), std::move(input), std::move(requests), error, small};
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParserLimits,
    ::testing::Values(
        limit_case("HeadersUnderLimit", head_of_size(127), {get("/")}),
        limit_case("HeadersAtLimit", head_of_size(128), {get("/")}),
        limit_case("HeadersOverLimit", head_of_size(129), {}, parse_error::headers_too_large),
        limit_case("HeadersFarOverLimit", head_of_size(1000), {}, parse_error::headers_too_large),
        limit_case("RequestLineOverLimit", "GET /" + std::string(200, 'p') + " HTTP/1.1\r\n\r\n",
                   {}, parse_error::headers_too_large),
        limit_case("UnterminatedHeadersAtLimit", head_of_size(130).substr(0, 128), {},
                   parse_error::headers_too_large),
        parse_case{"UnterminatedHeadersUnderLimit",
                   head_of_size(130).substr(0, 127),
                   {},
                   parse_error::none,
                   small,
                   true},
        limit_case("LimitAppliesPerRequest", head_of_size(128) + head_of_size(128),
                   {get("/"), get("/")}),
        limit_case("LeadingEmptyLinesDoNotCount", "\r\n\r\n" + head_of_size(128), {get("/")}),
        limit_case("BodyAtLimit", body_of_size(64), {post("/x", std::string(64, 'b'))}),
        limit_case("BodyOverLimit", body_of_size(65), {}, parse_error::body_too_large),
        limit_case("HugeContentLength",
                   "POST /x HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n", {},
                   parse_error::body_too_large),
        limit_case("ChunkedBodyAtLimit", chunked(chunk(40) + chunk(24) + "0\r\n\r\n"),
                   {post("/x", std::string(64, 'c'))}),
        limit_case("ChunkedBodyOverLimit", chunked(chunk(40) + chunk(25) + "0\r\n\r\n"), {},
                   parse_error::body_too_large),
        limit_case("ChunkAnnouncedOverLimit", chunked("41\r\n"), {}, parse_error::body_too_large),
        limit_case("ChunkSizeOverflows", chunked("ffffffffffffffffffffffff\r\n"), {},
                   parse_error::body_too_large),
        limit_case("TrailersAtLimit", chunked("0\r\nX: " + std::string(128 - 7, 't') + "\r\n\r\n"),
                   {post("/x", "")}),
        limit_case("TrailersOverLimit",
                   chunked("0\r\nX: " + std::string(128 - 6, 't') + "\r\n\r\n"), {},
                   parse_error::headers_too_large),
        limit_case("ChunkLineTooLong", chunked("1;" + std::string(5000, 'e') + "\r\nz\r\n"), {},
                   parse_error::bad_chunk)),
    case_name);

TEST(Parser, BodyTooLargeIsReportedBeforeTheBodyArrives) {
  parser p(small);
  feed(p, "POST /x HTTP/1.1\r\nContent-Length: 65\r\n\r\n");
  EXPECT_EQ(p.next(), parse_status::error);
  EXPECT_EQ(p.error(), parse_error::body_too_large);
}

TEST(Parser, ChunkAnnouncedOverLimitFailsBeforeItsData) {
  parser p(small);
  feed(p, chunked("10\r\n" + std::string(16, 'x') + "\r\n41\r\n"));
  EXPECT_EQ(p.next(), parse_status::error);
  EXPECT_EQ(p.error(), parse_error::body_too_large);
}

TEST(Parser, AnnouncesTheBodyBeforeItArrives) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nContent-Length: 1000");
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_EQ(p.body_bytes_announced(), 0u);  // the headers are not complete yet
  feed(p, "\r\n\r\nab");
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_EQ(p.body_bytes_announced(), 1000u);
  feed(p, std::string(998, 'x'));
  ASSERT_EQ(p.next(), parse_status::ready);
  p.consume();
  EXPECT_EQ(p.body_bytes_announced(), 0u);
  // Chunked: what was decoded plus the chunk under way.
  feed(p, chunked("3\r\nabc\r\n100\r\nxy"));
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_EQ(p.body_bytes_announced(), 3u + 0x100u);
}

TEST(Parser, ErrorIsSticky) {
  parser p;
  feed(p, "GET x HTTP/1.1\r\n\r\n");
  EXPECT_EQ(p.next(), parse_status::error);
  feed(p, "GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(p.next(), parse_status::error);
  EXPECT_EQ(p.error(), parse_error::bad_request_line);
  EXPECT_FALSE(p.take_continue_request());
}

TEST(Parser, PipelinedRequestsParseWithoutNewInput) {
  parser p;
  feed(p,
       "POST /keys/batch_exists HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
       "POST /keys/confirm_write HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
       "1\r\n{\r\n1;x=y\r\n}\r\n0\r\nT: v\r\n\r\n"
       "GET /rank/7 HTTP/1.1\r\n\r\n");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().target, "/keys/batch_exists");
  EXPECT_EQ(p.current().body, "{}");
  EXPECT_EQ(p.next(), parse_status::ready);  // still the same request until consume()
  EXPECT_EQ(p.current().target, "/keys/batch_exists");
  p.consume();
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().target, "/keys/confirm_write");
  EXPECT_EQ(p.current().body, "{}");
  p.consume();
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().verb, method::get);
  EXPECT_EQ(p.current().target, "/rank/7");
  EXPECT_TRUE(p.current().body.empty());
  p.consume();
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_FALSE(p.mid_request());
}

// Random mixes of requests cut at random places parse like the whole stream.
TEST(Parser, RandomPipelinesParseWhateverTheSplit) {
  std::mt19937 rng(12345);
  const std::vector<std::pair<std::string, seen_request>> pool = {
      {"GET /a HTTP/1.1\r\n\r\n", get("/a")},
      {body_of_size(100), post("/x", std::string(100, 'b'))},
      {chunked(chunk(7, 'q') + chunk(300, 'r') + "0\r\n\r\n"),
       post("/x", std::string(7, 'q') + std::string(300, 'r'))},
      {"POST /y?z HTTP/1.1\r\nContent-Length: 0\r\nExpect: 100-continue\r\n\r\n", post("/y", "")},
  };
  for (int round = 0; round < 200; ++round) {
    std::string input;
    outcome expected;
    const int count = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < count; ++i) {
      const auto& [bytes, seen] = pool[rng() % pool.size()];
      input += bytes;
      expected.requests.push_back(seen);
    }
    std::vector<std::size_t> cuts;
    for (std::size_t at = 0; at < input.size(); at += 1 + rng() % 50) cuts.push_back(at);
    ASSERT_EQ(run(input, cuts, {}, 1 + rng() % 64), expected) << "round " << round;
  }
}

// Corrupted requests (any byte, anywhere) fail or parse the same however they arrive.
TEST(Parser, MutatedInputParsesTheSameWhateverTheSplit) {
  std::mt19937 rng(777);
  const std::string seeds[] = {
      "POST /keys/batch_exists HTTP/1.1\r\nContent-Length: 4\r\nConnection: close\r\n\r\n{}{}",
      chunked("3;e=1\r\nabc\r\n10\r\n" + std::string(16, 'd') + "\r\n0\r\nT: 1\r\n\r\n"),
      "GET /rank/1?x HTTP/1.0\r\nExpect: 100-continue\r\nConnection: keep-alive\r\n\r\n",
  };
  const char alphabet[] = "\r\n :;0aF/-?\t\x01\x80";
  for (int round = 0; round < 300; ++round) {
    std::string input = seeds[rng() % std::size(seeds)];
    input += seeds[rng() % std::size(seeds)];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < edits; ++i) {
      const std::size_t at = rng() % input.size();
      const char c = alphabet[rng() % (sizeof alphabet - 1)];
      switch (rng() % 3) {
        case 0:
          input[at] = c;
          break;
        case 1:
          input.insert(at, 1, c);
          break;
        default:
          input.erase(at, 1);
          break;
      }
    }
    const limits lim =
        (round % 2 == 0) ? limits{} : limits{.header_bytes_max = 64, .body_bytes_max = 16};
    const outcome whole = run_whole(input, lim);
    expect_split_invariant(input, whole, lim);
    if (HasFatalFailure()) {
      ADD_FAILURE() << "round " << round << " input " << ::testing::PrintToString(input);
      return;
    }
  }
}

TEST(Parser, ExpectContinueIsRequestedOnceWhileTheBodyIsMissing) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 4\r\n\r\n");
  EXPECT_FALSE(p.take_continue_request());  // nothing parsed yet
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_TRUE(p.take_continue_request());
  EXPECT_FALSE(p.take_continue_request());
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_FALSE(p.take_continue_request());
  feed(p, "abcd");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_FALSE(p.take_continue_request());
  EXPECT_EQ(p.current().body, "abcd");
}

TEST(Parser, ExpectContinueIsNotRequestedWhenTheBodyIsBuffered) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nabcd");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_FALSE(p.take_continue_request());
}

TEST(Parser, ExpectContinueIsNotRequestedForAnEmptyBody) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_FALSE(p.take_continue_request());
}

TEST(Parser, ExpectContinueWorksForChunkedBodies) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab");
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_TRUE(p.take_continue_request());
  feed(p, "\r\n0\r\n\r\n");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().body, "ab");
}

TEST(Parser, ExpectContinueIsIgnoredForHttp10) {
  parser p;
  feed(p, "POST /x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_FALSE(p.take_continue_request());
}

TEST(Parser, OtherExpectationsAreIgnored) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nExpect: 100-continue-please\r\nContent-Length: 4\r\n\r\n");
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_FALSE(p.take_continue_request());
}

TEST(Parser, ExpectContinueIsPerRequest) {
  parser p;
  feed(p,
       "POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx"
       "POST /b HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_FALSE(p.take_continue_request());
  p.consume();
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_TRUE(p.take_continue_request());
}

TEST(Parser, ExpectContinueIsDroppedWhenTheRequestFails) {
  parser p;
  feed(p, "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_EQ(p.next(), parse_status::need_more);
  feed(p, "zz\r\n");
  EXPECT_EQ(p.next(), parse_status::error);
  EXPECT_FALSE(p.take_continue_request());
}

TEST(Parser, BodyIsFollowedByZeroedPadding) {
  for (const std::string& input : {body_of_size(10), chunked(chunk(10) + "0\r\n\r\n"),
                                   std::string("GET / HTTP/1.1\r\n\r\n")}) {
    parser p;
    feed(p, input, 1);
    ASSERT_EQ(p.next(), parse_status::ready) << input;
    const std::string_view body = p.current().body;
    for (std::size_t i = 0; i < body_padding_bytes; ++i) {
      EXPECT_EQ(body.data()[body.size() + i], '\0') << input << " at " << i;
    }
  }
}

TEST(Parser, PaddingMayOverlapThePipelinedRequest) {
  parser p;
  feed(p, body_of_size(3) + "GET / HTTP/1.1\r\n\r\n", 1);
  ASSERT_EQ(p.next(), parse_status::ready);
  expect_padding_readable(p.current().body);
  p.consume();
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().target, "/");
}

TEST(Parser, ReadSpaceGivesAtLeastWhatIsAsked) {
  parser p;
  for (std::size_t min :
       {std::size_t{1}, std::size_t{100}, std::size_t{16 * 1024}, std::size_t{1024 * 1024}}) {
    EXPECT_GE(p.read_space(min).size(), min);
  }
}

TEST(Parser, ReadSpaceKeepsTheReadyRequestValid) {
  parser p;
  const std::string first = body_of_size(50);
  feed(p, first + "GET /next", 1);
  ASSERT_EQ(p.next(), parse_status::ready);
  const request& r = p.current();
  // Forces the buffer to move while the request is still being handled.
  feed(p, " HTTP/1.1\r\n\r\n", 4 * 1024 * 1024);
  EXPECT_EQ(r.target, "/x");
  EXPECT_EQ(r.body, std::string(50, 'b'));
  expect_padding_readable(r.body);
  std::span<char> more = p.read_space(8 * 1024 * 1024);  // moves it again
  EXPECT_GE(more.size(), 8u * 1024 * 1024);
  EXPECT_EQ(r.body, std::string(50, 'b'));
  p.consume();
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().target, "/next");
}

TEST(Parser, MidRequestTracksPartialInput) {
  parser p;
  EXPECT_FALSE(p.mid_request());
  feed(p, "GET / HT");
  EXPECT_TRUE(p.mid_request());
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_TRUE(p.mid_request());
  feed(p, "TP/1.1\r\n\r\nPOST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nab");
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_FALSE(p.mid_request());
  p.consume();
  EXPECT_TRUE(p.mid_request());
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_TRUE(p.mid_request());
  feed(p, "cde");
  ASSERT_EQ(p.next(), parse_status::ready);
  p.consume();
  EXPECT_FALSE(p.mid_request());
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_FALSE(p.mid_request());
}

TEST(Parser, LargeContentLengthBodyArrivesInPieces) {
  const std::size_t size = 4 * 1024 * 1024;
  std::string body(size, '\0');
  for (std::size_t i = 0; i < size; ++i) body[i] = static_cast<char>('a' + i % 26);
  const std::string input =
      "POST /keys/batch_exists HTTP/1.1\r\nContent-Length: " + std::to_string(size) + "\r\n\r\n" +
      body + "GET /after HTTP/1.1\r\n\r\n";
  std::vector<std::size_t> cuts;
  for (std::size_t at = 1000; at < input.size(); at += 65536) cuts.push_back(at);
  const outcome o = run(input, cuts);
  ASSERT_EQ(o.error, parse_error::none);
  ASSERT_EQ(o.requests.size(), 2u);
  EXPECT_TRUE(o.requests[0].body == body);
  EXPECT_EQ(o.requests[1].target, "/after");
}

TEST(Parser, LargeChunkedBodyArrivesInPieces) {
  std::string encoded;
  std::string body;
  for (std::size_t i = 0; body.size() < 2 * 1024 * 1024; ++i) {
    const std::size_t size = 1 + (i * 7919) % 20000;
    const char fill = static_cast<char>('a' + i % 26);
    encoded += chunk(size, fill);
    body += std::string(size, fill);
  }
  const std::string input = chunked(encoded + "0\r\n\r\n") + "GET /after HTTP/1.1\r\n\r\n";
  std::vector<std::size_t> cuts;
  for (std::size_t at = 500; at < input.size(); at += 3001) cuts.push_back(at);
  const outcome o = run(input, cuts, {}, 4096);
  ASSERT_EQ(o.error, parse_error::none);
  ASSERT_EQ(o.requests.size(), 2u);
  EXPECT_TRUE(o.requests[0].body == body);
  EXPECT_EQ(o.requests[1].target, "/after");
}

// Framing bytes of already-decoded chunks are dropped, so tiny chunks with long
// extensions do not make the input buffer hold the whole encoded body.
TEST(Parser, ChunkFramingDoesNotAccumulateInTheBuffer) {
  const limits lim{.header_bytes_max = 1024, .body_bytes_max = 4096};
  parser p(lim);
  feed(p, chunked(""), 1);
  const std::string tiny = "1;" + std::string(200, 'e') + "\r\nz\r\n";
  for (int i = 0; i < 4096; ++i) {
    feed(p, tiny, 1);
    ASSERT_EQ(p.next(), parse_status::need_more);
  }
  EXPECT_LT(p.read_space(1).size(), 64u * 1024);  // 800 KiB went through
  feed(p, "0\r\n\r\n", 1);
  ASSERT_EQ(p.next(), parse_status::ready);
  EXPECT_EQ(p.current().body, std::string(4096, 'z'));
}

TEST(Parser, SlowHeadersByteByByteStillParse) {
  std::string input = "GET /slow HTTP/1.1\r\n";
  for (int i = 0; i < 600; ++i) input += "X-Header-" + std::to_string(i) + ": some value\r\n";
  input += "\r\n";
  const outcome o = run_byte_by_byte(input);
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].target, "/slow");
}

TEST(Parser, NothingBufferedNeedsMore) {
  parser p;
  EXPECT_EQ(p.next(), parse_status::need_more);
  feed(p, "\r\n");
  EXPECT_EQ(p.next(), parse_status::need_more);
  EXPECT_FALSE(p.mid_request());
}

}  // namespace
}  // namespace metad::http
