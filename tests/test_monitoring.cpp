// Monitoring: TensorBoard event files read back by a decoder of this test's
// own (its own CRC-32C and protobuf reading, not the writer's), the
// Prometheus registry's text, the /metrics endpoint against hostile peers,
// and both during real jobs, against the job's metrics.jsonl.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/system_config.hpp"
#include "config/job_config.hpp"
#include "monitoring/crc32c.hpp"
#include "monitoring/http_request.hpp"
#include "monitoring/output_file.hpp"
#include "monitoring/prometheus_exporter.hpp"
#include "monitoring/prometheus_registry.hpp"
#include "monitoring/prometheus_sink.hpp"
#include "monitoring/tensorboard_writer.hpp"
#include "runtime/job.hpp"
#include "runtime/process_monitoring.hpp"
#include "runtime/topology.hpp"
#include "tests/free_port.hpp"
#include "tests/processes.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ------------------------------------------------ an independent event reader

// CRC-32C from its definition: the table is built here, bit by bit from the
// polynomial's normal (unreflected) form, reflected at the end.
struct reference_crc32c {
  std::array<uint32_t, 256> table{};
  reference_crc32c() {
    uint32_t reflected_poly = 0;
    for (int b = 0; b < 32; ++b)
      if (0x1EDC6F41u & (1u << b)) reflected_poly |= 1u << (31 - b);
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t r = n;
      for (int k = 0; k < 8; ++k) r = (r >> 1) ^ ((r & 1u) ? reflected_poly : 0u);
      table[n] = r;
    }
  }
  uint32_t operator()(const std::string& s) const {
    uint32_t r = ~0u;
    for (unsigned char ch : s) r = table[(r ^ ch) & 0xFF] ^ (r >> 8);
    return ~r;
  }
  uint32_t masked(const std::string& s) const {
    const uint32_t r = (*this)(s);
    return ((r >> 15) | (r << 17)) + 0xA282EAD8u;
  }
};

struct decode_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct scalar {
  std::string tag;
  float value = 0;
};

struct event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<scalar> values;
};

// Protobuf's wire format, read from a string.
struct wire_reader {
  const std::string& s;
  std::size_t at = 0;
  bool done() const { return at >= s.size(); }
  uint8_t byte() {
    if (at >= s.size()) throw decode_error("protobuf: truncated");
    return static_cast<uint8_t>(s[at++]);
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw decode_error("protobuf: varint too long");
  }
  uint64_t little_endian(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(byte()) << (8 * i);
    return v;
  }
  std::string bytes() {
    const uint64_t n = varint();
    if (n > s.size() - at) throw decode_error("protobuf: length past the end");
    std::string out = s.substr(at, n);
    at += n;
    return out;
  }
  // The field's number and wire type; skips nothing.
  std::pair<uint64_t, uint64_t> key() {
    const uint64_t k = varint();
    return {k >> 3, k & 7};
  }
};

double as_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

float as_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

scalar decode_value(const std::string& data) {
  wire_reader r{data};
  scalar v;
  while (!r.done()) {
    auto [field, type] = r.key();
    if (field == 1 && type == 2)
      v.tag = r.bytes();
    else if (field == 2 && type == 5)
      v.value = as_float(static_cast<uint32_t>(r.little_endian(4)));
    else
      throw decode_error("Summary.Value: unexpected field " + std::to_string(field));
  }
  return v;
}

event decode_event(const std::string& data) {
  wire_reader r{data};
  event e;
  while (!r.done()) {
    auto [field, type] = r.key();
    if (field == 1 && type == 1) {
      e.wall_time = as_double(r.little_endian(8));
    } else if (field == 2 && type == 0) {
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && type == 2) {
      e.file_version = r.bytes();
    } else if (field == 5 && type == 2) {
      const std::string summary = r.bytes();
      wire_reader sr{summary};
      while (!sr.done()) {
        auto [sf, st] = sr.key();
        if (sf != 1 || st != 2) throw decode_error("Summary: unexpected field");
        e.values.push_back(decode_value(sr.bytes()));
      }
    } else {
      throw decode_error("Event: unexpected field " + std::to_string(field));
    }
  }
  return e;
}

using troupe::test::read_file;

uint64_t le(const std::string& s, std::size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

// Every record of an event file, both CRCs checked.
std::vector<event> read_events(const fs::path& file) {
  static const reference_crc32c crc;
  const std::string s = read_file(file);
  std::vector<event> out;
  std::size_t at = 0;
  while (at < s.size()) {
    if (s.size() - at < 12) throw decode_error("record header truncated");
    const std::string length_bytes = s.substr(at, 8);
    const uint64_t n = le(s, at, 8);
    if (le(s, at + 8, 4) != crc.masked(length_bytes)) throw decode_error("length CRC mismatch");
    at += 12;
    if (s.size() - at < n + 4) throw decode_error("record data truncated");
    const std::string data = s.substr(at, n);
    if (le(s, at + n, 4) != crc.masked(data)) throw decode_error("data CRC mismatch");
    at += n + 4;
    out.push_back(decode_event(data));
  }
  return out;
}

// The one event file of a run directory.
fs::path event_file_in(const fs::path& run) {
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(run))
    if (f.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(f.path());
  REQUIRE(files.size() == 1);
  return files[0];
}

std::vector<json> jsonl(const fs::path& file) {
  std::vector<json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// ------------------------------------------------------------ a plain client

struct client_socket {
  int fd = -1;
  // `from`: the loopback address to connect from (127.0.0.x: another peer
  // address to the server).
  explicit client_socket(uint16_t port, const char* from = nullptr) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    // A safety net so that a broken server fails the test instead of hanging it.
    timeval tv{60, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (from) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      REQUIRE(::inet_pton(AF_INET, from, &local.sin_addr) == 1);
      REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~client_socket() {
    if (fd >= 0) ::close(fd);
  }
  void send_all(const std::string& s) {
    std::size_t sent = 0;
    while (sent < s.size()) {
      const ssize_t n = ::send(fd, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may close early (431, 400): what it said is read next
      sent += static_cast<std::size_t>(n);
    }
  }
  // Everything until the server closes.
  std::string read_all() {
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  }
};

std::string request(uint16_t port, const std::string& raw, const char* from = nullptr) {
  client_socket c(port, from);
  c.send_all(raw);
  return c.read_all();
}

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

std::string body_of(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The value of the sample `name{labels...}` in a /metrics body; NaN if absent.
double sample_value(const std::string& body, const std::string& name,
                    const std::string& label_part = "") {
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    const std::string series = line.substr(0, sp);
    const auto brace = series.find('{');
    if (series.substr(0, brace) != name) continue;
    if (!label_part.empty() && series.find(label_part) == std::string::npos) continue;
    return std::stod(line.substr(sp + 1));
  }
  return std::nan("");
}

// The port in a metrics_port file; 0 when there is none.
uint16_t read_port_file(const fs::path& p) {
  std::ifstream in(p);
  int port = 0;
  in >> port;
  return port > 0 && port < 65536 ? static_cast<uint16_t>(port) : 0;
}

}  // namespace

// ---------------------------------------------------------------- the format

TEST_CASE("crc32c: the check value of the standard, from both implementations") {
  const std::string check = "123456789";
  CHECK(monitoring::crc32c(check) == 0xE3069283u);
  CHECK(reference_crc32c()(check) == 0xE3069283u);
  CHECK(monitoring::crc32c("") == 0u);
  const std::string s = "brain.Event:2";
  CHECK(monitoring::masked_crc32c(s.data(), s.size()) == reference_crc32c().masked(s));
}

TEST_CASE("tensorboard_writer: the independent reader gets back every scalar") {
  test::temp_dir tmp;
  std::string path;
  {
    monitoring::tensorboard_writer w(tmp / "run");
    path = w.path();
    w.add_scalar("step/loss", 0.25f, 7, 1700000000.5);
    w.add_scalar("epoch/test_accuracy", 0.875f, int64_t{1} << 40, 1700000001.25);
    w.add_scalar("x", -3.5e-8f, 0, 0);
  }
  CHECK(std::regex_match(fs::path(path).filename().string(),
                         std::regex(R"(events\.out\.tfevents\.[0-9]{10}\.[^/]+)")));
  auto events = read_events(path);
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].values.empty());
  CHECK(events[0].wall_time > 1.6e9);
  CHECK(events[1].step == 7);
  CHECK(events[1].wall_time == 1700000000.5);
  REQUIRE(events[1].values.size() == 1);
  CHECK(events[1].values[0].tag == "step/loss");
  CHECK(events[1].values[0].value == 0.25f);
  CHECK(events[2].step == int64_t{1} << 40);
  CHECK(events[2].values[0].tag == "epoch/test_accuracy");
  CHECK(events[2].values[0].value == 0.875f);
  CHECK(events[3].values[0].value == -3.5e-8f);
}

TEST_CASE("the reader refuses a damaged event file (so the checks above can fail)") {
  test::temp_dir tmp;
  std::string path;
  {
    monitoring::tensorboard_writer w(tmp / "run");
    path = w.path();
    w.add_scalar("step/loss", 0.5f, 1, 1.0);
  }
  auto bytes = read_file(path);
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's data
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  CHECK_THROWS_WITH_AS(read_events(path), "data CRC mismatch", decode_error);
}

TEST_CASE("tensorboard_writer: an unwritable directory is an error naming it") {
  test::temp_dir tmp;
  std::ofstream(tmp / "file") << "x";
  CHECK_THROWS_WITH_AS(monitoring::tensorboard_writer(tmp / "file/run"),
                       doctest::Contains("cannot create TensorBoard directory"),
                       monitoring::tensorboard_error);
}

// ------------------------------------------------------------- the registry

TEST_CASE("prometheus_registry: the text format, counters and gauges typed") {
  monitoring::prometheus_registry r(monitoring::metric_labels{{"task", "chief:0"}});
  r.set("troupe_step", monitoring::metric_kind::gauge, "the step", {}, 40);
  r.add("troupe_lines_total", "lines", {{"type", "step"}}, 1);
  r.add("troupe_lines_total", "lines", {{"type", "step"}}, 2);
  r.set("troupe_odd-name", monitoring::metric_kind::gauge, "help with \\ and\nnewline",
        {{"label", "a\"b\\c\nd"}}, std::nan(""));
  const std::string text = r.render();
  CHECK(text ==
        "# HELP troupe_lines_total lines\n"
        "# TYPE troupe_lines_total counter\n"
        "troupe_lines_total{task=\"chief:0\",type=\"step\"} 3\n"
        "# HELP troupe_odd_name help with \\\\ and\\nnewline\n"
        "# TYPE troupe_odd_name gauge\n"
        "troupe_odd_name{task=\"chief:0\",label=\"a\\\"b\\\\c\\nd\"} NaN\n"
        "# HELP troupe_step the step\n"
        "# TYPE troupe_step gauge\n"
        "troupe_step{task=\"chief:0\"} 40\n");
  CHECK(monitoring::metric_name("9lives.x") == "_lives_x");
  CHECK(monitoring::metric_value(0.1) == "0.1");
  CHECK(monitoring::metric_value(-INFINITY) == "-Inf");
}

TEST_CASE("prometheus_sink: every number of a line, totals as counters, roles as labels") {
  auto r = std::make_shared<monitoring::prometheus_registry>();
  monitoring::prometheus_sink sink(r);
  sink.write({{"type", "step"}, {"step", 10}, {"loss", 0.5}, {"lr", 0.01}}, 10);
  sink.write({{"type", "shard"}, {"shard", 1}, {"pushes", 12}, {"staleness_mean", 1.5}}, 12);
  sink.write({{"type", "summary"}, {"summary", {{"steps", 12}}}}, 12);
  CHECK(r->value("troupe_step") == 12);
  CHECK(r->value("troupe_step_loss") == 0.5);
  CHECK(r->value("troupe_step_lr") == 0.01);
  CHECK(r->value("troupe_shard_pushes_total", {{"shard", "1"}}) == 12);
  CHECK(r->value("troupe_shard_staleness_mean", {{"shard", "1"}}) == 1.5);
  CHECK(r->value("troupe_metrics_lines_total", {{"type", "step"}}) == 1);
  CHECK(std::isnan(r->value("troupe_metrics_lines_total", {{"type", "summary"}})));
  const auto text = r->render();
  CHECK(text.find("# TYPE troupe_shard_pushes_total counter\n") != std::string::npos);
  CHECK(text.find("# TYPE troupe_step_loss gauge\n") != std::string::npos);
}

// ------------------------------------------------------------ the endpoint

TEST_CASE("parse_head: request lines, complete heads, garbage") {
  monitoring::request_line r;
  CHECK(monitoring::parse_head("GET /metrics HTTP/1.1\r\nHost: x\r\n", r) ==
        monitoring::head_status::incomplete);
  CHECK(monitoring::parse_head("GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n", r) ==
        monitoring::head_status::complete);
  CHECK(r.method == "GET");
  CHECK(r.path == "/metrics");
  CHECK(monitoring::parse_head("GET /metrics HTTP/1.0\n\n", r) ==
        monitoring::head_status::complete);
  CHECK(monitoring::parse_head("GET /me", r) == monitoring::head_status::incomplete);
  for (const char* bad : {"hello\r\n", "GET metrics HTTP/1.1\r\n", "GET /metrics HTTP/2\r\n",
                          "get /metrics HTTP/1.1\r\n", "GET  /metrics HTTP/1.1\r\n",
                          "GET /met\x01rics HTTP/1.1\r\n", "AVERYLONGMETHODNAMEX / HTTP/1.1\r\n"}) {
    CAPTURE(bad);
    CHECK(monitoring::parse_head(bad, r) == monitoring::head_status::bad);
  }
}

TEST_CASE("prometheus_exporter: /metrics, /healthz, and every other request refused") {
  auto registry = std::make_shared<monitoring::prometheus_registry>();
  registry->set("troupe_step", monitoring::metric_kind::gauge, "the step", {}, 5);
  monitoring::exporter_options o;
  o.request_timeout = std::chrono::milliseconds(300);
  monitoring::prometheus_exporter ex(registry, o);
  const uint16_t port = ex.port();
  REQUIRE(port != 0);
  CHECK(ex.endpoint() == "127.0.0.1:" + std::to_string(port));

  auto ok = request(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  CHECK(status_of(ok) == 200);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(sample_value(body_of(ok), "troupe_step") == 5);
  auto head = request(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(status_of(head) == 200);
  CHECK(body_of(head).empty());
  auto health = request(port, "GET /healthz HTTP/1.0\r\n\r\n");
  CHECK(status_of(health) == 200);
  CHECK(body_of(health) == "ok\n");

  CHECK(status_of(request(port, "GET /secrets HTTP/1.1\r\n\r\n")) == 404);
  auto post = request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  CHECK(status_of(post) == 405);
  CHECK(post.find("Allow: GET, HEAD") != std::string::npos);
  CHECK(status_of(request(port, "\x16\x03\x01garbage that is no HTTP\r\n\r\n")) == 400);
  // A head larger than the 8 KiB buffer, without an end.
  CHECK(status_of(request(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a'))) == 431);
  // A slow sender: half a request, then nothing, is cut off at the deadline.
  {
    client_socket slow(port);
    slow.send_all("GET /metr");
    CHECK(status_of(slow.read_all()) == 408);
  }
  // A peer that connects and closes at once gets nothing and harms nothing.
  { client_socket gone(port); }
  auto after = request(port, "GET /metrics HTTP/1.1\r\n\r\n");
  CHECK(status_of(after) == 200);
  const auto body = body_of(after);
  CHECK(sample_value(body, "troupe_metrics_http_responses_total", "code=\"431\"") == 1);
  CHECK(sample_value(body, "troupe_metrics_http_responses_total", "code=\"408\"") == 1);
  CHECK(sample_value(body, "troupe_metrics_http_responses_total", "code=\"400\"") == 1);
  CHECK(sample_value(body, "troupe_metrics_http_responses_total", "code=\"405\"") == 1);
  CHECK(sample_value(body, "troupe_metrics_http_responses_total", "code=\"404\"") == 1);
}

TEST_CASE("prometheus_exporter: connections past the limit get 503; it ends with peers open") {
  auto registry = std::make_shared<monitoring::prometheus_registry>();
  monitoring::exporter_options o;
  o.max_connections = 2;
  o.max_per_address = 2;
  // The two idle peers stay for the whole test.
  o.request_timeout = o.idle_timeout = std::chrono::seconds(120);
  auto ex = std::make_unique<monitoring::prometheus_exporter>(registry, o);
  client_socket idle1(ex->port()), idle2(ex->port());
  idle1.send_all("GET /metrics HTTP/1.1\r\n");  // never finished
  CHECK(status_of(request(ex->port(), "GET /metrics HTTP/1.1\r\n\r\n")) == 503);
  CHECK(registry->value("troupe_metrics_http_responses_total", {{"code", "503"}}) == 1);
  ex.reset();  // returns although two peers still hold their connections
  CHECK(idle1.read_all().empty());
  CHECK(idle2.read_all().empty());
}

namespace {

// Until the exporter has answered `n` connections with 503 (10 s at most).
bool wait_for_503s(const monitoring::prometheus_registry& registry, double n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (registry.value("troupe_metrics_http_responses_total", {{"code", "503"}}) < n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

TEST_CASE("prometheus_exporter: idle connections from one address never starve other scrapers") {
  // Issue 40, row 6: 16 idle connections to /metrics took every slot, and
  // every scraper and /healthz got 503.
  auto registry = std::make_shared<monitoring::prometheus_registry>();
  monitoring::exporter_options o;                                  // 16 slots, 4 per address
  o.request_timeout = o.idle_timeout = std::chrono::seconds(120);  // the hog stays
  monitoring::prometheus_exporter ex(registry, o);
  std::vector<std::unique_ptr<client_socket>> hog;
  for (int i = 0; i < 16; ++i)
    hog.push_back(std::make_unique<client_socket>(ex.port(), "127.0.0.2"));
  // The hog's address holds its 4 slots; its other 12 connections are
  // turned away at once.
  CHECK(wait_for_503s(*registry, 12));
  auto metrics = request(ex.port(), "GET /metrics HTTP/1.1\r\n\r\n", "127.0.0.1");
  CHECK(status_of(metrics) == 200);
  auto health = request(ex.port(), "GET /healthz HTTP/1.1\r\n\r\n", "127.0.0.3");
  CHECK(status_of(health) == 200);
  CHECK(body_of(health) == "ok\n");
  CHECK(registry->value("troupe_metrics_http_responses_total", {{"code", "503"}}) == 12);
  // What the turned-away ones read: a 503 naming why.
  int told = 0;
  for (auto& c : hog) {
    timeval tv{0, 200000};  // the 4 held ones get nothing yet
    ::setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const auto r = c->read_all();
    if (status_of(r) == 503 && body_of(r) == "too many connections from this address\n") ++told;
  }
  CHECK(told == 12);
}

TEST_CASE("prometheus_exporter: a connection that sends nothing is closed after idle_timeout") {
  auto registry = std::make_shared<monitoring::prometheus_registry>();
  monitoring::exporter_options o;
  o.idle_timeout = std::chrono::milliseconds(200);
  o.request_timeout = std::chrono::seconds(120);
  monitoring::prometheus_exporter ex(registry, o);
  const auto start = std::chrono::steady_clock::now();
  {
    client_socket silent(ex.port());
    CHECK(status_of(silent.read_all()) == 408);
  }
  // Well before request_timeout (120 s) and the client's own 60 s guard.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  // One that has started its request has request_timeout, not idle_timeout.
  client_socket slow(ex.port());
  slow.send_all("GET /metrics HTTP/1.1\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  slow.send_all("\r\n");
  CHECK(status_of(slow.read_all()) == 200);
}

TEST_CASE("prometheus_exporter: an address in use or not numeric is an error naming it") {
  auto registry = std::make_shared<monitoring::prometheus_registry>();
  monitoring::prometheus_exporter first(registry, {});
  monitoring::exporter_options o;
  o.port = first.port();
  CHECK_THROWS_WITH_AS(monitoring::prometheus_exporter(registry, o),
                       ("cannot serve /metrics on 127.0.0.1:" + std::to_string(first.port()) +
                        ": Address already in use")
                           .c_str(),
                       monitoring::exporter_error);
  o.address = "localhost";
  CHECK_THROWS_WITH_AS(monitoring::prometheus_exporter(registry, o),
                       "'localhost' is not a numeric IPv4 or IPv6 address",
                       monitoring::exporter_error);
}

// ------------------------------------------------------------- the config

TEST_CASE("config: logging.tensorboard, metrics_port and metrics_address") {
  auto parse = [](json logging) { return parse_job_config({{"logging", logging}}).logging; };
  auto l = parse({{"tensorboard", true}, {"metrics_port", 9100}, {"metrics_address", "0.0.0.0"}});
  CHECK(l.tensorboard);
  CHECK(l.metrics_port == 9100);
  CHECK(l.metrics_address == "0.0.0.0");
  CHECK(parse({{"metrics_port", "auto"}}).metrics_port == logging_config::kMetricsPortAuto);
  CHECK(parse(json::object()).metrics_port == 0);
  CHECK(parse({{"metrics_address", "::1"}}).metrics_address == "::1");
  CHECK_THROWS_WITH_AS(parse({{"metrics_port", 70000}}),
                       "logging.metrics_port: expected an integer in 0..65535 (0: off) or "
                       "\"auto\" (a free port), got 70000",
                       config_error);
  CHECK_THROWS_WITH_AS(parse({{"metrics_port", -1}}),
                       doctest::Contains("logging.metrics_port: expected an integer in 0..65535"),
                       config_error);
  CHECK_THROWS_WITH_AS(parse({{"metrics_port", "9100"}}), doctest::Contains("got \"9100\""),
                       config_error);
  CHECK_THROWS_WITH_AS(
      parse({{"metrics_address", "localhost"}}),
      "logging.metrics_address: expected a numeric IPv4 or IPv6 address such as \"127.0.0.1\", "
      "got \"localhost\"",
      config_error);
  CHECK_THROWS_WITH_AS(parse({{"tensorboard", "yes"}}),
                       doctest::Contains("logging.tensorboard: expected true or false"),
                       config_error);
  // The effective config says what was asked, "auto" included.
  job_config c;
  c.logging.metrics_port = logging_config::kMetricsPortAuto;
  c.logging.tensorboard = true;
  auto back = parse_job_config(to_json(c));
  CHECK(back.logging.metrics_port == logging_config::kMetricsPortAuto);
  CHECK(back.logging.tensorboard);
}

// --------------------------------------------------------------- real jobs

TEST_CASE("a job's TensorBoard events hold exactly the numbers of its metrics.jsonl, per role") {
  test::strategy_env env(480);
  auto c = env.job("parameter_server", "sgd", 2, 16);
  c.strategy.shards = 2;
  c.training.epochs = 2;
  c.training.eval_every_epochs = 1;
  c.logging.every_steps = 4;
  c.logging.tensorboard = true;
  const double before = monitoring::unix_seconds_now();
  auto s = run_job(c);
  const double after = monitoring::unix_seconds_now();
  const fs::path out = c.logging.output_dir;

  // What each run directory must hold, from metrics.jsonl by the documented
  // rule: lines about one shard/worker/actor in its own run, the rest in
  // "job"; every number but step and the role as "<type>/<field>".
  struct expected_scalar {
    std::string tag;
    float value;
    std::optional<int64_t> step;
  };
  std::map<std::string, std::vector<expected_scalar>> want;
  for (const auto& line : jsonl(out / "metrics.jsonl")) {
    const std::string type = line["type"];
    if (type == "summary") continue;
    std::string run = "job";
    std::string role;
    for (const char* k : {"shard", "worker", "actor"})
      if (line.contains(k)) {
        role = k;
        run = role + "_" + std::to_string(line[k].get<int64_t>());
        break;
      }
    std::optional<int64_t> step;
    if (line.contains("step")) step = line["step"].get<int64_t>();
    for (const auto& [k, v] : line.items())
      if (v.is_number() && k != "step" && k != role)
        want[run].push_back({type + "/" + k, static_cast<float>(v.get<double>()), step});
  }
  REQUIRE(want.count("job") == 1);
  REQUIRE(want.count("shard_0") == 1);
  REQUIRE(want.count("shard_1") == 1);
  REQUIRE(want.count("worker_0") == 1);
  REQUIRE(want.count("worker_1") == 1);

  std::set<std::string> runs;
  for (const auto& d : fs::directory_iterator(out / "tensorboard"))
    runs.insert(d.path().filename().string());
  CHECK(runs.size() == want.size());
  int compared = 0;
  for (const auto& [run, scalars] : want) {
    CAPTURE(run);
    auto events = read_events(event_file_in(out / "tensorboard" / run));
    REQUIRE(!events.empty());
    CHECK(events[0].file_version == "brain.Event:2");
    REQUIRE(events.size() == scalars.size() + 1);
    for (std::size_t i = 0; i < scalars.size(); ++i) {
      const auto& e = events[i + 1];
      REQUIRE(e.values.size() == 1);
      CHECK(e.values[0].tag == scalars[i].tag);
      CHECK(e.values[0].value == scalars[i].value);
      if (scalars[i].step) CHECK(e.step == *scalars[i].step);
      CHECK(e.wall_time >= before - 1);
      CHECK(e.wall_time <= after + 1);
      ++compared;
    }
  }
  // The scalars the issue names are among them.
  std::set<std::string> job_tags;
  for (const auto& w : want["job"]) job_tags.insert(w.tag);
  for (const char* t : {"step/loss", "step/lr", "step/samples_per_second", "epoch/train_accuracy",
                        "epoch/test_accuracy"})
    CHECK(job_tags.count(t) == 1);
  std::set<std::string> shard_tags;
  for (const auto& w : want["shard_0"]) shard_tags.insert(w.tag);
  CHECK(shard_tags.count("shard/staleness_mean") == 1);
  CHECK(compared > 50);
  CHECK(s["steps"].get<int64_t>() > 0);

  // A fresh run in the same output replaces the earlier event files, as it
  // replaces metrics.jsonl.
  job_options again;
  again.overwrite = true;
  run_job(c, again);
  CHECK_NOTHROW(event_file_in(out / "tensorboard" / "job"));
}

TEST_CASE("logging.tensorboard_dir puts the event files there, not under the output") {
  test::strategy_env env(240);
  auto c = env.job("one_device", "sgd", 1, 16);
  c.logging.every_steps = 4;
  c.logging.tensorboard = true;
  test::temp_dir tb;
  c.logging.tensorboard_dir = tb / "events";
  run_job(c);
  const fs::path out = c.logging.output_dir;
  CHECK_FALSE(fs::exists(out / "tensorboard"));
  auto events = read_events(event_file_in(fs::path(tb / "events") / "job"));
  std::size_t losses = 0, lines = 0;
  for (const auto& e : events)
    for (const auto& v : e.values) losses += v.tag == "step/loss";
  for (const auto& line : jsonl(out / "metrics.jsonl")) lines += line["type"] == "step";
  CHECK(lines > 0);
  CHECK(losses == lines);
}

TEST_CASE(
    "/metrics scraped during a job: the step grows with every report; hostile peers don't "
    "harm it") {
  test::strategy_env env(480);
  auto c = env.job("", "sgd", 1, 16);
  c.training.epochs = 2;
  c.logging.every_steps = 5;
  c.logging.metrics_port = logging_config::kMetricsPortAuto;
  const fs::path out = c.logging.output_dir;
  std::vector<int64_t> reported;
  std::vector<double> reported_loss;
  std::vector<std::string> scrapes;
  std::vector<int> health;
  job_options o;
  // On the coordinator's thread, after each progress line is written: the
  // endpoint's own thread answers meanwhile. What it sees is checked after
  // the job.
  o.on_progress = [&](const progress_info& p) {
    const uint16_t port = read_port_file(out / "metrics_port");
    if (port == 0) return;
    if (reported.empty()) {
      request(port, "garbage\r\n\r\n");
      request(port, "GET /metrics HTTP/1.1\r\n" + std::string(10000, 'x'));
      request(port, "DELETE /metrics HTTP/1.1\r\n\r\n");
    }
    reported.push_back(p.step);
    reported_loss.push_back(p.loss);
    scrapes.push_back(request(port, "GET /metrics HTTP/1.1\r\n\r\n"));
    health.push_back(status_of(request(port, "GET /healthz HTTP/1.1\r\n\r\n")));
  };
  auto s = run_job(c, o);
  CHECK(s["steps"] == 2 * 30);  // 480 / 16 per epoch: the job ran to its end
  REQUIRE(reported.size() >= 4);
  REQUIRE(scrapes.size() == reported.size());
  std::vector<int64_t> scraped;
  for (std::size_t i = 0; i < scrapes.size(); ++i) {
    CAPTURE(i);
    CHECK(status_of(scrapes[i]) == 200);
    const auto body = body_of(scrapes[i]);
    scraped.push_back(static_cast<int64_t>(sample_value(body, "troupe_step")));
    CHECK(sample_value(body, "troupe_up", "task=\"local\"") == 1);
    CHECK(sample_value(body, "troupe_step_loss") == doctest::Approx(reported_loss[i]));
    CHECK(sample_value(body, "troupe_actors_running") >= 1);
    CHECK(health[i] == 200);
  }
  CHECK(scraped == reported);
  for (std::size_t i = 1; i < scraped.size(); ++i) CHECK(scraped[i] > scraped[i - 1]);
  // The hostile requests were refused, and counted.
  const auto last = body_of(scrapes.back());
  CHECK(sample_value(last, "troupe_metrics_http_responses_total", "code=\"400\"") == 1);
  CHECK(sample_value(last, "troupe_metrics_http_responses_total", "code=\"405\"") == 1);
}

TEST_CASE("a process without a coordinator (a troupe node task) exports its liveness") {
  test::temp_dir tmp;
  job_config c;
  c.name = "nodejob";
  c.logging.metrics_port = logging_config::kMetricsPortAuto;
  system_config cfg;
  caf::actor_system sys{cfg};
  {
    process_monitoring m(c, tmp.str(), "worker:1", sys);
    const uint16_t port = read_port_file(tmp / "metrics_port.worker-1");
    REQUIRE(port != 0);
    const auto body = body_of(request(port, "GET /metrics HTTP/1.1\r\n\r\n"));
    CHECK(sample_value(body, "troupe_up", "troupe_job=\"nodejob\",task=\"worker:1\"") == 1);
    CHECK(sample_value(body, "troupe_actors_running") >= 0);
    CHECK(sample_value(body, "troupe_start_time_seconds") > 1.6e9);
    CHECK(std::isnan(sample_value(body, "troupe_step")));
  }
  // Off: nothing is served, no port file.
  c.logging.metrics_port = 0;
  process_monitoring off(c, tmp / "off", "worker:2", sys);
  CHECK_FALSE(fs::exists(tmp / "off/metrics_port.worker-2"));
}

// ------------------------------------------------ files under predictable names

namespace {

// A file outside the output directory that a planted link points to, and
// what it held before.
struct victim {
  fs::path path;
  std::string before = "the victim's own bytes\n";
  explicit victim(const fs::path& dir) : path(dir / "victim") { std::ofstream(path) << before; }
  bool untouched() const { return read_file(path) == before; }
};

}  // namespace

TEST_CASE("output_file: a planted symbolic or hard link is refused naming it, nothing written") {
  test::temp_dir tmp;
  const fs::path dir = tmp.path;
  victim v(tmp.path);
  const auto link = dir / "out.txt";
  fs::create_symlink(v.path, link);
  using monitoring::output_file;
  for (auto m :
       {output_file::mode::create_new, output_file::mode::replace, output_file::mode::append})
    CHECK_THROWS_WITH_AS(
        output_file(link.string(), m),
        (link.string() + ": is a symbolic link; refusing to write through it").c_str(),
        monitoring::output_file_error);
  // A dangling link too: O_CREAT would have made its target.
  fs::create_symlink(dir / "made-through-the-link", dir / "dangling");
  CHECK_THROWS_AS(output_file((dir / "dangling").string(), output_file::mode::replace),
                  monitoring::output_file_error);
  CHECK_FALSE(fs::exists(dir / "made-through-the-link"));
  // A hard link to another file: refused before it is truncated.
  fs::create_hard_link(v.path, dir / "hard.txt");
  CHECK_THROWS_WITH_AS(monitoring::write_output_file((dir / "hard.txt").string(), "x"),
                       ((dir / "hard.txt").string() +
                        ": has 2 hard links; refusing to write through a link to another file")
                           .c_str(),
                       monitoring::output_file_error);
  CHECK(v.untouched());
  // A file of its own is replaced; create_new never replaces one.
  monitoring::write_output_file((dir / "own.txt").string(), "one\n");
  monitoring::write_output_file((dir / "own.txt").string(), "two\n");
  CHECK(read_file(dir / "own.txt") == "two\n");
  CHECK_THROWS_WITH_AS(output_file((dir / "own.txt").string(), output_file::mode::create_new),
                       doctest::Contains("own.txt: cannot create: File exists"),
                       monitoring::output_file_error);
}

TEST_CASE(
    "replace_file_atomically: links at the temporary and the target are replaced, not followed") {
  test::temp_dir tmp;
  const fs::path dir = tmp.path;
  victim v(dir);
  fs::create_symlink(v.path, dir / "summary.json");
  fs::create_symlink(v.path, dir / ".summary.json.tmp");
  monitoring::replace_file_atomically((dir / "summary.json").string(),
                                      (dir / ".summary.json.tmp").string(), "{}\n");
  CHECK(v.untouched());
  CHECK_FALSE(fs::is_symlink(dir / "summary.json"));
  CHECK(read_file(dir / "summary.json") == "{}\n");
  CHECK_FALSE(fs::exists(fs::symlink_status(dir / ".summary.json.tmp")));
}

TEST_CASE("tensorboard_writer: an event file name taken by a symbolic link is refused, naming it") {
  test::temp_dir tmp;
  const fs::path dir = tmp.path;
  victim v(tmp.path);
  const auto run = dir / "run";
  fs::create_directories(run);
  // Every name the writer may pick in the next 30 seconds is a link.
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const auto now = static_cast<int64_t>(monitoring::unix_seconds_now());
  for (int64_t t = now; t < now + 30; ++t)
    fs::create_symlink(v.path, run / ("events.out.tfevents." + std::to_string(t) + "." + host));
  std::string msg;
  try {
    monitoring::tensorboard_writer w(run.string());
  } catch (const monitoring::tensorboard_error& e) {
    msg = e.what();
  }
  CHECK_MESSAGE(msg.starts_with("cannot write TensorBoard event file " +
                                (run / "events.out.tfevents.").string()),
                msg);
  CHECK_MESSAGE(msg.ends_with(": is a symbolic link; refusing to write through it"), msg);
  CHECK(v.untouched());
}

TEST_CASE("the /metrics port file is never written through a planted link") {
  test::temp_dir tmp;
  const fs::path dir = tmp.path;
  victim v(tmp.path);
  fs::create_symlink(v.path, dir / "metrics_port.worker-1");
  job_config c;
  c.logging.metrics_port = logging_config::kMetricsPortAuto;
  system_config cfg;
  caf::actor_system sys{cfg};
  {
    process_monitoring m(c, tmp.str(), "worker:1", sys);  // serves; the file is only warned about
  }
  CHECK(v.untouched());
  CHECK(fs::is_symlink(dir / "metrics_port.worker-1"));
  // Without the link, the port is written.
  fs::remove(dir / "metrics_port.worker-1");
  process_monitoring m(c, tmp.str(), "worker:1", sys);
  CHECK(read_port_file(dir / "metrics_port.worker-1") != 0);
}

TEST_CASE("config.json and summary.json: a planted link is a job_error naming it") {
  test::temp_dir tmp;
  const fs::path dir = tmp.path;
  victim v(tmp.path);
  fs::create_symlink(v.path, dir / "summary.json");
  CHECK_THROWS_WITH_AS(write_job_file((dir / "summary.json").string(), "{}\n"),
                       ("cannot write " + (dir / "summary.json").string() +
                        ": is a symbolic link; refusing to write through it")
                           .c_str(),
                       job_error);
  CHECK(v.untouched());
}

// ------------------------------------------------------- troupe node tasks

namespace {

using troupe::test::free_port;

// The port in `file` once a running process wrote it (0 if it never did).
uint16_t wait_for_port_file(const fs::path& file, test::node_proc& p) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  uint16_t port = 0;
  while ((port = read_port_file(file)) == 0 && p.running() &&
         std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return port;
}

}  // namespace

TEST_CASE("every troupe node task serves /metrics: workers their liveness, the chief the step") {
  test::strategy_env env(2000);
  auto c = env.job("mirrored", "adam", 2, 16);
  c.training.epochs = 5;
  c.logging.every_steps = 1;
  c.logging.metrics_port = logging_config::kMetricsPortAuto;
  c.checkpoint.every_steps = 0;
  test::temp_dir dir;
  c.logging.output_dir = dir / "out";
  auto j = to_json(c);
  j["cluster"] = {{"tasks",
                   {{"chief", {"127.0.0.1:" + std::to_string(free_port())}},
                    {"worker", {"127.0.0.1:" + std::to_string(free_port())}}}},
                  {"join_timeout_seconds", 30},
                  {"heartbeat_seconds", 0.5}};
  const std::string config = dir / "job.json";
  std::ofstream(config) << j.dump(2);
  test::node_proc worker(config, "worker:0", dir / "worker.log", test::kSecret);
  test::node_proc chief(config, "chief:0", dir / "chief.log", test::kSecret);

  // The worker serves from its start until the chief ends the job.
  const uint16_t worker_port = wait_for_port_file(dir / "out/metrics_port.worker-0", worker);
  REQUIRE_MESSAGE(worker_port != 0, worker.output());
  const auto wbody = body_of(request(worker_port, "GET /metrics HTTP/1.1\r\n\r\n"));
  CHECK(sample_value(wbody, "troupe_up", "task=\"worker:0\"") == 1);
  CHECK(sample_value(wbody, "troupe_actors_running") >= 1);
  CHECK(status_of(request(worker_port, "GET /healthz HTTP/1.1\r\n\r\n")) == 200);

  // The chief's step, scraped while it trains, only grows.
  const uint16_t chief_port = wait_for_port_file(dir / "out/metrics_port.chief-0", chief);
  REQUIRE_MESSAGE(chief_port != 0, chief.output());
  std::vector<int64_t> steps;
  while (chief.running()) {
    const auto r = request(chief_port, "GET /metrics HTTP/1.1\r\n\r\n");
    const double step = sample_value(body_of(r), "troupe_step", "task=\"chief:0\"");
    if (!std::isnan(step) && (steps.empty() || int64_t(step) != steps.back()))
      steps.push_back(static_cast<int64_t>(step));
    if (steps.size() >= 3) break;
  }
  CHECK_MESSAGE(steps.size() >= 3, chief.output());
  for (std::size_t i = 1; i < steps.size(); ++i) CHECK(steps[i] > steps[i - 1]);
  CHECK_MESSAGE(chief.wait(std::chrono::seconds(120)) == 0, chief.output());
  CHECK_MESSAGE(worker.wait(std::chrono::seconds(60)) == 0, worker.output());
}
