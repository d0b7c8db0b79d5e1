#include "config/json_limits.hpp"

namespace troupe {

std::size_t json_nesting_depth(std::string_view text, bool comments, std::size_t limit) {
  std::size_t depth = 0, deepest = 0;
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < n && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (comments && c == '/' && i + 1 < n && text[i + 1] == '/') {
      while (i < n && text[i] != '\n') ++i;
    } else if (comments && c == '/' && i + 1 < n && text[i + 1] == '*') {
      for (i += 2; i < n && !(text[i] == '*' && i + 1 < n && text[i + 1] == '/');) ++i;
      ++i;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > limit) return deepest;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace troupe
