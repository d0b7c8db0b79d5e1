#pragma once
// The option parser of the subcommands that take a job config (run, node,
// launch): each declares its options once, and the usage errors are worded
// alike: "--output needs a directory", "unknown option '--frob' for run",
// "run takes one config file, got 'a.json' and 'b.json'", "--resume and
// --overwrite exclude each other".
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cli {

class option_parser {
 public:
  // Accepts a value; returns why not ("" when it is taken).
  using value_taker = std::function<std::string(const std::string&)>;

  // `command` is named in the errors ("unknown option '--x' for launch").
  explicit option_parser(std::string command);
  // Its options refer to it (--config checks the file already given).
  option_parser(const option_parser&) = delete;
  option_parser& operator=(const option_parser&) = delete;

  // `--name VALUE` into `target`; `missing` is the error when VALUE is absent.
  option_parser& value(const std::string& name, std::string& target, std::string missing);
  // `--name VALUE` handed to `take`.
  option_parser& value(const std::string& name, value_taker take, std::string missing);
  // `--name` sets `target`.
  option_parser& flag(const std::string& name, bool& target);
  // The command's one config file, positional and, with `config_option`, also
  // `--config FILE`; `missing` is the error when none is given.
  option_parser& config_file(std::string& target, bool config_option, std::string missing);
  // Everything after `--`, unparsed (without this, `--` is an unknown option).
  option_parser& rest_after_dashes(std::vector<std::string>& target);
  // Two flags that cannot both be given.
  option_parser& exclusive(const std::string& a, const std::string& b);

  // The first usage error in `args`, in this order: the arguments left to
  // right, a missing config file, exclusive flags; nullopt when there is none.
  std::optional<std::string> parse(const std::vector<std::string>& args) const;

 private:
  struct option {
    std::string name;
    value_taker take;  // null for a flag
    std::string missing;
    bool* flag = nullptr;
  };
  const option* find(const std::string& name) const;

  std::string command_;
  std::vector<option> options_;
  std::string* config_file_ = nullptr;
  std::string config_missing_;
  std::vector<std::string>* rest_ = nullptr;
  std::vector<std::pair<std::string, std::string>> exclusive_;
};

}  // namespace troupe::cli
