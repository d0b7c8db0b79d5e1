#pragma once
// Limits on JSON read from files (job configs, cluster specs, checkpoint
// manifests), checked on the raw text BEFORE it is parsed: nlohmann's
// json destroys and dumps values recursively, so a document nested 200,000
// levels deep would overflow the stack. A cheap scan counts the open [ and {
// outside strings (and, for configs, outside // and /* */ comments).
#include <cstddef>
#include <string_view>

namespace troupe {

// Deepest nesting any troupe file needs is under 10; 64 leaves room.
inline constexpr std::size_t kMaxJsonDepth = 64;

// The nesting depth of `text` ([ and { outside strings and, when `comments`,
// outside comments), or the first depth above `limit` (the scan stops there).
// Never fails: malformed text is left to the parser.
std::size_t json_nesting_depth(std::string_view text, bool comments,
                               std::size_t limit = kMaxJsonDepth);

}  // namespace troupe
