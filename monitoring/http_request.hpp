#pragma once
// The little of HTTP/1.x that /metrics needs, for requests from anyone: the
// request line of a head read into a fixed buffer, and the one response per
// connection (Connection: close). Nothing here allocates by what a peer
// sends; views point into the caller's buffer.
#include <string>
#include <string_view>

namespace troupe::monitoring {

struct request_line {
  std::string_view method;
  std::string_view path;  // the target without its query
};

enum class head_status {
  incomplete,  // read on (within the size cap and the deadline)
  complete,    // the head ends ("\r\n\r\n" or "\n\n") and its first line is well formed
  bad,         // the first line is not "METHOD /target HTTP/1.x"
};

// Parses the bytes read so far. The first line is judged as soon as it ends,
// so garbage is answered without waiting for the rest.
head_status parse_head(std::string_view bytes, request_line& out);

// A whole response: status line, Content-Type, Content-Length, Connection:
// close, and the body (left out for HEAD).
std::string http_response(int code, const std::string& content_type, const std::string& body,
                          bool head_only = false);
const char* reason_phrase(int code);

}  // namespace troupe::monitoring
