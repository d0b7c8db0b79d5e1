#pragma once
// Deterministic mutations of a valid input, for the parser tests in the
// normal suite: the same seed gives the same mutants on every machine.
#include <cstdint>
#include <string>

namespace troupe::fuzz {

class mutator {
 public:
  explicit mutator(uint64_t seed) : state_(seed) {}

  // One mutant of `valid`: 1-4 edits, each a bit flip, a truncation, an
  // inserted or deleted byte, a digit changed, or a run of nesting brackets.
  std::string operator()(const std::string& valid) {
    std::string s = valid;
    const int edits = 1 + static_cast<int>(below(4));
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = s.empty() ? 0 : below(s.size() + 1);
      switch (below(7)) {
        case 0:  // one flipped bit
          if (!s.empty()) s[at % s.size()] ^= static_cast<char>(1u << below(8));
          break;
        case 1:  // truncation
          s.resize(at);
          break;
        case 2: {  // an interesting byte inserted
          static const char bytes[] = "[]{}\",:-09e.\\\x00\xff ";
          s.insert(at, 1, bytes[below(sizeof bytes - 1)]);
          break;
        }
        case 3:  // a byte deleted
          if (at < s.size()) s.erase(at, 1);
          break;
        case 4:  // a digit replaced by a large or negative number
          if (at < s.size() && s[at] >= '0' && s[at] <= '9')
            s.replace(at, 1, below(2) ? "9223372036854775807" : "-1");
          else if (!s.empty())
            s[at % s.size()] = static_cast<char>('0' + below(10));
          break;
        case 5:  // deep nesting
          s.insert(at, std::string(1 + below(200), below(2) ? '[' : '{'));
          break;
        default:  // a random byte
          if (!s.empty()) s[at % s.size()] = static_cast<char>(below(256));
          break;
      }
    }
    return s;
  }

  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace troupe::fuzz
