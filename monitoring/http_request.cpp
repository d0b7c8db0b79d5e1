#include "monitoring/http_request.hpp"

namespace troupe::monitoring {
namespace {

constexpr std::size_t kMaxMethod = 16;

bool is_token_char(char c) {
  return c >= 'A' && c <= 'Z';
}

bool is_target_char(char c) {
  return c > ' ' && c < 0x7F;  // visible ASCII, no space
}

bool parse_first_line(std::string_view line, request_line& out) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const auto sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0 || sp1 > kMaxMethod) return false;
  const auto method = line.substr(0, sp1);
  for (char c : method)
    if (!is_token_char(c)) return false;
  const auto sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return false;
  const auto target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (target.empty() || target[0] != '/') return false;
  for (char c : target)
    if (!is_target_char(c)) return false;
  const auto version = line.substr(sp2 + 1);
  if (version != "HTTP/1.0" && version != "HTTP/1.1") return false;
  out.method = method;
  out.path = target.substr(0, target.find('?'));
  return true;
}

}  // namespace

head_status parse_head(std::string_view bytes, request_line& out) {
  const auto eol = bytes.find('\n');
  if (eol == std::string_view::npos) return head_status::incomplete;
  if (!parse_first_line(bytes.substr(0, eol), out)) return head_status::bad;
  const bool ended = bytes.find("\r\n\r\n") != std::string_view::npos ||
                     bytes.find("\n\n") != std::string_view::npos;
  return ended ? head_status::complete : head_status::incomplete;
}

const char* reason_phrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

std::string http_response(int code, const std::string& content_type, const std::string& body,
                          bool head_only) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason_phrase(code) + "\r\n";
  r += "Content-Type: " + content_type + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (code == 405) r += "Allow: GET, HEAD\r\n";
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

}  // namespace troupe::monitoring
