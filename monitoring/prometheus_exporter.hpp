#pragma once
// GET /metrics (the registry in Prometheus' text format) and GET /healthz
// ("ok": a liveness probe) over HTTP/1.x, on one thread of its own.
//
// Outside the cluster gate and read-only: it serves anyone who can connect,
// so it is bound to 127.0.0.1 unless configured otherwise, and it treats
// every peer as hostile: a request head is read into a fixed buffer
// (max_request_bytes, else 431), must be complete within request_timeout
// (else 408: a slow sender holds a slot that long at most), and a
// connection that sends nothing is closed after idle_timeout; at most
// max_connections are served at once, at most max_per_address of them for
// one peer address (others get 503), so that idle connections from one
// address never starve other scrapers or /healthz; at most a few
// connections are accepted per turn of the loop; other paths get 404 and
// other methods 405, garbage 400; every connection is closed after its one
// response. Nothing a peer sends allocates; no peer can block the job,
// whose only contact is the registry's lock.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "monitoring/prometheus_registry.hpp"

namespace troupe::monitoring {

class exporter_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct exporter_options {
  std::string address = "127.0.0.1";  // a numeric IPv4 or IPv6 address
  uint16_t port = 0;                  // 0: one the OS picks (see port())
  std::size_t max_connections = 16;
  std::size_t max_per_address = 0;  // 0: a quarter of max_connections (at least 1)
  std::size_t max_request_bytes = 8192;
  std::chrono::milliseconds request_timeout{5000};
  std::chrono::milliseconds idle_timeout{2000};  // until the first byte
};

class prometheus_exporter {
 public:
  // Listens at once (throws exporter_error naming the address) and serves
  // until destroyed. The exporter counts its responses in the registry
  // (troupe_metrics_http_responses_total{code}).
  prometheus_exporter(std::shared_ptr<prometheus_registry> registry, exporter_options opts);
  ~prometheus_exporter();  // stops the thread, closes every connection
  prometheus_exporter(const prometheus_exporter&) = delete;
  prometheus_exporter& operator=(const prometheus_exporter&) = delete;

  uint16_t port() const { return port_; }
  // "127.0.0.1:9100", "[::1]:9100".
  std::string endpoint() const;

 private:
  struct state;
  void serve();

  std::unique_ptr<state> st_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace troupe::monitoring
