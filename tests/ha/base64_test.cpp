// Base64 as etcd's gateway uses it: RFC 4648 vectors, binary bytes, malformed input.
#include "ha/base64.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace metad;

namespace {

TEST(Base64, EncodesRfc4648Vectors) {
  EXPECT_EQ(ha::base64_encode(""), "");
  EXPECT_EQ(ha::base64_encode("f"), "Zg==");
  EXPECT_EQ(ha::base64_encode("fo"), "Zm8=");
  EXPECT_EQ(ha::base64_encode("foo"), "Zm9v");
  EXPECT_EQ(ha::base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(ha::base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(ha::base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(ha::base64_encode("/x/leader"), "L3gvbGVhZGVy");  // as etcd printed it
}

TEST(Base64, RoundTripsEveryByteValueAndLength) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  for (std::size_t n = 0; n <= bytes.size(); n += 7) {
    const std::string part = bytes.substr(0, n);
    EXPECT_EQ(ha::base64_decode(ha::base64_encode(part)), part) << n;
  }
}

TEST(Base64, RejectsMalformedText) {
  for (const char* bad : {"Z", "Zg=", "Zg==Zg==", "Z===", "=Zg=", "Zm9v!A==", "Zm 9", "Zg=A"}) {
    EXPECT_FALSE(ha::base64_decode(bad).has_value()) << bad;
  }
  EXPECT_EQ(ha::base64_decode(""), "");
}

}  // namespace
