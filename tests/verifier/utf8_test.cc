#include "verifier/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kappa::verifier {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  for (const char* text : {"", "plain ascii 12+34=46", "caf\xc3\xa9", "\xe2\x82\xac 5",
                           "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(IsValidUtf8(text)) << text;
  }
  EXPECT_TRUE(IsValidUtf8(std::string("nul\0inside", 10)));
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
    EXPECT_FALSE(IsValidUtf8(text)) << testing::PrintToString(text);
  }
}

}  // namespace
}  // namespace kappa::verifier
