#include "monitoring/prometheus_registry.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace troupe::monitoring {
namespace {

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string render_labels(const metric_labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += metric_name(k) + "=\"" + escape_label_value(v) + "\"";
  }
  return out;
}

}  // namespace

std::string metric_name(const std::string& raw) {
  std::string out = raw.empty() ? "_" : raw;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) out[i] = '_';
  }
  return out;
}

std::string metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

prometheus_registry::prometheus_registry(metric_labels common) : common_(render_labels(common)) {}

prometheus_registry::family& prometheus_registry::family_of(const std::string& name,
                                                            metric_kind kind,
                                                            const std::string& help) {
  auto [it, fresh] = families_.try_emplace(metric_name(name));
  if (fresh) {
    it->second.kind = kind;
    it->second.help = help;
  }
  return it->second;
}

std::string prometheus_registry::label_text(const metric_labels& labels) const {
  std::string own = render_labels(labels);
  if (common_.empty()) return own;
  return own.empty() ? common_ : common_ + "," + own;
}

void prometheus_registry::set(const std::string& name, metric_kind kind, const std::string& help,
                              const metric_labels& labels, double value) {
  std::lock_guard<std::mutex> g(mu_);
  family_of(name, kind, help).samples[label_text(labels)] = value;
}

void prometheus_registry::add(const std::string& name, const std::string& help,
                              const metric_labels& labels, double delta) {
  std::lock_guard<std::mutex> g(mu_);
  family_of(name, metric_kind::counter, help).samples[label_text(labels)] += delta;
}

void prometheus_registry::set_callback(const std::string& name, metric_kind kind,
                                       const std::string& help, std::function<double()> read) {
  std::lock_guard<std::mutex> g(mu_);
  family_of(name, kind, help).read = std::move(read);
}

void prometheus_registry::remove_callback(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  families_.erase(metric_name(name));
}

double prometheus_registry::value(const std::string& name, const metric_labels& labels) const {
  std::lock_guard<std::mutex> g(mu_);
  auto f = families_.find(metric_name(name));
  if (f == families_.end()) return std::numeric_limits<double>::quiet_NaN();
  if (f->second.read) return f->second.read();
  auto s = f->second.samples.find(label_text(labels));
  return s == f->second.samples.end() ? std::numeric_limits<double>::quiet_NaN() : s->second;
}

std::string prometheus_registry::render() const {
  std::lock_guard<std::mutex> g(mu_);
  std::string out;
  for (const auto& family : families_) {
    // Not a structured binding: clang 14 (the fuzz build) refuses to capture one.
    const std::string& name = family.first;
    const auto& f = family.second;
    out += "# HELP " + name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + name + (f.kind == metric_kind::counter ? " counter\n" : " gauge\n");
    auto sample = [&](const std::string& labels, double v) {
      out += name;
      if (!labels.empty()) out.append("{").append(labels).append("}");
      out.append(" ").append(metric_value(v)).append("\n");
    };
    if (f.read) sample(common_, f.read());
    for (const auto& [labels, v] : f.samples) sample(labels, v);
  }
  return out;
}

}  // namespace troupe::monitoring
