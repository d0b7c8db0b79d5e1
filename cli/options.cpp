#include "cli/options.hpp"

#include <algorithm>
#include <utility>

namespace troupe::cli {

option_parser::option_parser(std::string command) : command_(std::move(command)) {}

option_parser& option_parser::value(const std::string& name, std::string& target,
                                    std::string missing) {
  return value(
      name,
      [&target](const std::string& v) {
        target = v;
        return std::string();
      },
      std::move(missing));
}

option_parser& option_parser::value(const std::string& name, value_taker take,
                                    std::string missing) {
  options_.push_back({name, std::move(take), std::move(missing), nullptr});
  return *this;
}

option_parser& option_parser::flag(const std::string& name, bool& target) {
  options_.push_back({name, nullptr, {}, &target});
  return *this;
}

option_parser& option_parser::config_file(std::string& target, bool config_option,
                                          std::string missing) {
  config_file_ = &target;
  config_missing_ = std::move(missing);
  if (config_option)
    value(
        "--config",
        [this](const std::string& v) {
          if (!config_file_->empty()) return command_ + " takes one config file";
          *config_file_ = v;
          return std::string();
        },
        "--config needs a file");
  return *this;
}

option_parser& option_parser::rest_after_dashes(std::vector<std::string>& target) {
  rest_ = &target;
  return *this;
}

option_parser& option_parser::exclusive(const std::string& a, const std::string& b) {
  exclusive_.emplace_back(a, b);
  return *this;
}

const option_parser::option* option_parser::find(const std::string& name) const {
  auto it = std::find_if(options_.begin(), options_.end(),
                         [&](const option& o) { return o.name == name; });
  return it == options_.end() ? nullptr : &*it;
}

std::optional<std::string> option_parser::parse(const std::vector<std::string>& args) const {
  std::vector<std::string> given;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (rest_ && a == "--") {
      rest_->assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (const option* o = find(a)) {
      given.push_back(a);
      if (o->flag) {
        *o->flag = true;
        continue;
      }
      if (i + 1 >= args.size()) return o->missing;
      if (auto why = o->take(args[++i]); !why.empty()) return why;
    } else if (a.rfind("--", 0) == 0) {
      return "unknown option '" + a + "' for " + command_;
    } else if (!config_file_) {
      return "unexpected argument '" + a + "' for " + command_;
    } else if (config_file_->empty()) {
      *config_file_ = a;
    } else {
      return command_ + " takes one config file, got '" + *config_file_ + "' and '" + a + "'";
    }
  }
  if (config_file_ && config_file_->empty()) return config_missing_;
  for (const auto& [a, b] : exclusive_)
    if (std::count(given.begin(), given.end(), a) && std::count(given.begin(), given.end(), b))
      return a + " and " + b + " exclude each other";
  return std::nullopt;
}

}  // namespace troupe::cli
