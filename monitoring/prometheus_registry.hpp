#pragma once
// The latest values that /metrics serves, in Prometheus' text exposition
// format (version 0.0.4): per metric family a "# HELP" and a "# TYPE" line,
// then its samples. Written by the coordinator (prometheus_sink) and the
// process, read by the exporter's thread: every access takes the one lock.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace troupe::monitoring {

enum class metric_kind { counter, gauge };

using metric_labels = std::vector<std::pair<std::string, std::string>>;

class prometheus_registry {
 public:
  // `common` labels go on every sample (the task, the job's name).
  explicit prometheus_registry(metric_labels common = {});

  // Sets the sample of `name` with `labels` (a counter's value is the
  // running total, which only grows). Names are made valid ("a-b" ->
  // "a_b"); the first help and kind given for a name stay.
  void set(const std::string& name, metric_kind kind, const std::string& help,
           const metric_labels& labels, double value);
  void add(const std::string& name, const std::string& help, const metric_labels& labels,
           double delta);  // a counter
  // A sample read at each scrape. `read` runs on the exporter's thread under
  // the registry's lock: it must be cheap and thread-safe, and valid until
  // remove_callback(name) or the registry's end.
  void set_callback(const std::string& name, metric_kind kind, const std::string& help,
                    std::function<double()> read);
  void remove_callback(const std::string& name);

  // The value of a sample, for tests; NaN when there is none.
  double value(const std::string& name, const metric_labels& labels = {}) const;
  std::string render() const;

 private:
  struct family {
    metric_kind kind = metric_kind::gauge;
    std::string help;
    std::map<std::string, double> samples;  // by rendered label set
    std::function<double()> read;
  };
  family& family_of(const std::string& name, metric_kind kind, const std::string& help);
  std::string label_text(const metric_labels& labels) const;

  mutable std::mutex mu_;
  std::string common_;  // rendered common labels, without braces
  std::map<std::string, family> families_;
};

// "[a-zA-Z_:][a-zA-Z0-9_:]*": other characters become '_'.
std::string metric_name(const std::string& raw);
// A sample value as the format spells it (NaN, +Inf, -Inf, shortest digits).
std::string metric_value(double v);

}  // namespace troupe::monitoring
