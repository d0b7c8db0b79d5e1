// The cluster section of the schema (config/cluster_schema.hpp): tasks,
// hosts, timeouts, the secret's source, TLS and identity, their checks and
// their effective JSON.
#include "config/cluster_schema.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/json_read.hpp"

namespace troupe {
namespace {

using nlohmann::json;
using namespace json_read;

// An environment variable's name: letters, digits and '_', not starting with a digit.
std::string read_env_name(const json& v, const std::string& path) {
  const std::string want = "an environment variable name (letters, digits, '_')";
  if (!v.is_string()) expected(path, want, v);
  const auto& s = v.get_ref<const std::string&>();
  bool ok = !s.empty() && !(s[0] >= '0' && s[0] <= '9');
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      ok = false;
  if (!ok) expected(path, want, v);
  return s;
}

std::vector<int64_t> read_index_list(const json& v, const std::string& path) {
  if (!v.is_array()) expected(path, "an array of integers >= 0", v);
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(read_int(v[i], index(path, i), 0));
  return out;
}

}  // namespace

bool valid_device(const std::string& s) {
  std::string_view rest;
  if (s.starts_with("cpu:"))
    rest = std::string_view(s).substr(4);
  else if (s.starts_with("cuda:"))
    rest = std::string_view(s).substr(5);
  else if (s.starts_with("sim:"))  // a CPU device standing in for an accelerator (tests)
    rest = std::string_view(s).substr(4);
  else
    return false;
  if (rest.empty() || rest.size() > 9) return false;
  if (rest.size() > 1 && rest[0] == '0') return false;
  return std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The cluster spec (config/cluster.hpp): shapes and values here, the rules
// that involve other fields (a chief, placement vs strategy) in check_cluster.
void read_cluster(const json& j, const std::string& path, cluster_spec& c) {
  object_reader r(
      j, path,
      {"tasks", "hosts", "join_timeout_seconds", "heartbeat_seconds", "grace_seconds", "secret_env",
       "secret_file", "roles", "port", "tls", "insecure", "max_message_mb", "identity"});
  // Without "tasks", troupe node takes the cluster from the environment
  // (config/cluster_env.hpp); "roles" and "port" are for that case only.
  r.with("roles", [&](const json& v, const std::string& p) {
    object_reader roles(v, p, {"ps"});
    roles.with("ps",
               [&](const json& n, const std::string& np) { c.ps_ranks = read_int(n, np, 0); });
  });
  r.with("port", [&](const json& v, const std::string& p) {
    c.port = static_cast<uint16_t>(read_int_in(v, p, 1, 65535));
  });
  if (r.get("tasks") && (r.get("roles") || r.get("port")))
    fail(r.path(r.get("roles") ? "roles" : "port"),
         "is for a cluster from the environment; with cluster.tasks written out, place tasks "
         "with cluster.hosts instead");
  r.with("tasks", [&](const json& v, const std::string& p) {
    object_reader t(v, p, cluster_job_names());
    std::vector<std::pair<std::string, std::string>> seen;  // normalized address, its path
    for (const auto& name : cluster_job_names())
      t.with(name, [&](const json& list, const std::string& lp) {
        if (!list.is_array() || list.empty())
          expected(lp, "a non-empty array of \"host:port\" strings", list);
        auto& addresses = c.tasks[name];
        for (std::size_t i = 0; i < list.size(); ++i) {
          const std::string ip = index(lp, i);
          if (!list[i].is_string()) expected(ip, "\"host:port\"", list[i]);
          const auto& s = list[i].get_ref<const std::string&>();
          host_port hp;
          try {
            hp = parse_host_port(s);
          } catch (const std::invalid_argument& e) {
            fail(ip, e.what());
          }
          std::string key = hp.host;
          std::transform(key.begin(), key.end(), key.begin(),
                         [](char ch) { return (ch >= 'A' && ch <= 'Z') ? ch - 'A' + 'a' : ch; });
          key.push_back('|');
          key.append(std::to_string(hp.port));
          for (const auto& [other, where] : seen)
            if (other == key)
              fail(ip, "duplicate address " + show(list[i]) + " (already " + where + ")");
          seen.emplace_back(key, ip);
          addresses.push_back(s);
        }
      });
  });
  if (r.get("tasks") && c.tasks.empty())
    fail(r.path("tasks") + ".chief",
         "missing; a cluster needs exactly one chief task (it runs the coordinator); leave out "
         "cluster.tasks to take the cluster from the environment");
  r.with("hosts", [&](const json& v, const std::string& p) {
    if (!v.is_object())
      expected(p, "an object of \"job:index\" -> {\"replicas\", \"devices\", \"shards\"}", v);
    for (const auto& [key, e] : v.items()) {
      object_reader h(e, join(p, key), {"replicas", "devices", "shards"});
      task_hosts th;
      h.with("replicas",
             [&](const json& l, const std::string& lp) { th.replicas = read_index_list(l, lp); });
      h.with("shards",
             [&](const json& l, const std::string& lp) { th.shards = read_index_list(l, lp); });
      h.with("devices", [&](const json& l, const std::string& lp) {
        if (!l.is_array()) expected(lp, "an array of \"cpu:N\" or \"cuda:N\" strings", l);
        for (std::size_t i = 0; i < l.size(); ++i) {
          if (!l[i].is_string() || !valid_device(l[i].get_ref<const std::string&>()))
            expected(index(lp, i), "\"cpu:N\" or \"cuda:N\"", l[i]);
          th.devices.push_back(l[i].get<std::string>());
        }
      });
      c.hosts[key] = std::move(th);
    }
  });
  r.with("join_timeout_seconds", [&](const json& v, const std::string& p) {
    c.join_timeout_seconds = read_number(v, p, positive);
  });
  r.with("heartbeat_seconds", [&](const json& v, const std::string& p) {
    c.heartbeat_seconds = read_number(v, p, positive);
  });
  r.with("grace_seconds", [&](const json& v, const std::string& p) {
    c.grace_seconds = read_number(v, p, positive);
  });
  r.with("secret_env",
         [&](const json& v, const std::string& p) { c.secret_env = read_env_name(v, p); });
  r.with("secret_file",
         [&](const json& v, const std::string& p) { c.secret_file = read_string(v, p, false); });
  r.with("tls", [&](const json& v, const std::string& p) {
    object_reader t(v, p, {"ca", "cert", "key"});
    for (const char* key : {"ca", "cert", "key"})
      if (!t.get(key))
        fail(t.path(key), "missing; cluster.tls needs \"ca\", \"cert\" and \"key\" (PEM files)");
    t.with("ca",
           [&](const json& f, const std::string& fp) { c.tls.ca = read_string(f, fp, true); });
    t.with("cert",
           [&](const json& f, const std::string& fp) { c.tls.cert = read_string(f, fp, true); });
    t.with("key",
           [&](const json& f, const std::string& fp) { c.tls.key = read_string(f, fp, true); });
  });
  r.with("insecure", [&](const json& v, const std::string& p) {
    if (!v.is_boolean()) expected(p, "true or false", v);
    c.insecure = v.get<bool>();
  });
  if (c.insecure && r.get("tls"))
    fail(r.path("insecure"),
         "true turns TLS off, but cluster.tls names certificates; remove one of them");
  r.with("max_message_mb", [&](const json& v, const std::string& p) {
    c.max_message_mb = read_number(v, p, positive);
  });
  r.with("identity", [&](const json& v, const std::string& p) {
    if (v == "job_ca")
      c.identity = cluster_spec::identity_mode::job_ca;
    else if (v == "shared_secret")
      c.identity = cluster_spec::identity_mode::shared_secret;
    else
      expected(p, "\"job_ca\" or \"shared_secret\"", v);
  });
}

json cluster_to_json(const cluster_spec& k) {
  json hosts = json::object();
  for (const auto& [name, h] : k.hosts) {
    json e = {{"replicas", h.replicas}, {"shards", h.shards}};
    if (!h.devices.empty()) e["devices"] = h.devices;
    hosts[name] = std::move(e);
  }
  json out = {{"hosts", std::move(hosts)},
              {"join_timeout_seconds", k.join_timeout_seconds},
              {"heartbeat_seconds", k.heartbeat_seconds},
              {"grace_seconds", k.grace_seconds},
              {"secret_env", k.secret_env},
              {"secret_file", k.secret_file}};
  if (!k.tls.ca.empty()) out["tls"] = {{"ca", k.tls.ca}, {"cert", k.tls.cert}, {"key", k.tls.key}};
  if (k.insecure) out["insecure"] = true;
  if (k.identity == cluster_spec::identity_mode::shared_secret) out["identity"] = "shared_secret";
  if (k.max_message_mb > 0) out["max_message_mb"] = k.max_message_mb;
  if (!k.tasks.empty()) {
    out["tasks"] = k.tasks;
  } else {
    out["roles"] = {{"ps", k.ps_ranks}};
    if (k.port != 0) out["port"] = k.port;
  }
  return out;
}

}  // namespace troupe
