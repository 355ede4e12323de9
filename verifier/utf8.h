// UTF-8 well-formedness (RFC 3629): no overlong forms, no surrogates, nothing
// above U+10FFFF.
#pragma once

#include <string_view>

namespace kappa::verifier {

bool IsValidUtf8(std::string_view text);

}  // namespace kappa::verifier
