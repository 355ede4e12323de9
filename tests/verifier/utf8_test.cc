#include "base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kappa::base {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  for (const char* text : {"", "plain ascii 12+34=46", "caf\xc3\xa9", "\xe2\x82\xac 5",
                           "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(base::IsValidUtf8(text)) << text;
  }
  EXPECT_TRUE(base::IsValidUtf8(std::string("nul\0inside", 10)));
}

TEST(Utf8Test, LossyDecodingReplacesEachMaximalInvalidSubpart) {
  // Unicode's "maximal subpart" rule, as TextDecoder and from_utf8_lossy.
  EXPECT_EQ(base::LossyUtf8("a\xe4\xb8"), "a\uFFFD");                // truncated 3-byte: one
  EXPECT_EQ(base::LossyUtf8("\xe0\x80\x80"), "\uFFFD\uFFFD\uFFFD");  // overlong: one per byte
  EXPECT_EQ(base::LossyUtf8("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(base::LossyUtf8("\xf4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(base::LossyUtf8("\xe4\xb8\xad\xff!"), "\u4E2D\uFFFD!");
  EXPECT_EQ(base::FirstInvalidUtf8("ok\xc3("), 2u);
  EXPECT_EQ(base::DecodeUtf8("a\u00e9\U0001F600"), (std::u32string{U'a', 0xE9, 0x1F600}));
  EXPECT_EQ(base::EncodeUtf8(base::DecodeUtf8("a\u00e9\U0001F600")), "a\u00e9\U0001F600");
  EXPECT_EQ(base::CodePointCount("a\u00e9\U0001F600"), 3u);
}

TEST(Utf8Test, RejectsMalformedText) {
  for (const char* text : {
           "\x80",              // lone continuation byte
           "\xc3",              // truncated
           "\xc3\x28",          // bad continuation
           "\xc0\xaf",          // overlong '/'
           "\xe0\x80\xaf",      // overlong
           "\xed\xa0\x80",      // surrogate U+D800
           "\xf4\x90\x80\x80",  // above U+10FFFF
           "\xff",              // never valid
           "ok then \xfe",
       }) {
    EXPECT_FALSE(base::IsValidUtf8(text)) << testing::PrintToString(text);
  }
}

}  // namespace
}  // namespace kappa::base
