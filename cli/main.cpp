// troupe: the command-line front end.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "bench/allreduce.hpp"
#include "bench/kernels.hpp"
#include "checkpoint/checkpoint.hpp"
#include "cli/launch.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "config/job_config.hpp"
#include "config/secret.hpp"
#include "kernels/cpu_isa.hpp"
#include "net/launch_enrol.hpp"
#include "net/rendezvous.hpp"
#include "runtime/job.hpp"
#include "runtime/node.hpp"
#include "runtime/preemption.hpp"
#include "runtime/stop_policy.hpp"
#include "runtime/test_hooks.hpp"
#include "runtime/topology.hpp"

namespace {

constexpr const char* usage = R"(troupe — an actor-model runtime for distributed training

Usage:
  troupe run FILE [--output DIR] [--resume | --overwrite] [--trace FILE.json] [--quiet]
         [--tensorboard DIR]
                              train the job described by FILE (JSON)
  troupe validate FILE        check a job config; prints the effective config
  troupe node --config FILE --task NAME [--output DIR] [--resume | --overwrite]
         [--trace FILE.json] [--tensorboard DIR]
                              run one task (chief, worker:N, ps:N) of FILE's
                              cluster spec; the secret comes from the
                              environment or a file (cluster.secret_env/_file);
                              without --task and cluster.tasks, the rank comes
                              from TROUPE_RANK/RANK/SLURM_PROCID and the cluster
                              from a rendezvous at the chief (docs/clusters.md)
  troupe launch [--config] FILE [--output DIR] [--resume | --overwrite]
         [--restart-workers N] [-- ARGS]
                              start every task of FILE's cluster spec as a local
                              process (troupe node --task NAME ...), output
                              prefixed [NAME]; if one fails, stop the others,
                              unless it is a worker the strategy goes on without
                              (parameter_server, elastic_average, actor_learner):
                              then restart it, N times in all; SIGINT/SIGTERM
                              are forwarded to every task; exit status: the
                              chief's
  troupe report RUN_DIR... [-o FILE.html] [--trace TRACE.json]...
                              one self-contained HTML page comparing runs:
                              loss, accuracy (or return), throughput by step
                              and by wall time, staleness, configs (differences
                              highlighted), summaries, trace time shares
                              (default output: report.html)
  troupe checkpoint show DIR  list a checkpoint's variables (DIR: a checkpoint
                              or a directory of checkpoints -> the latest)
  troupe checkpoint diff A B  largest absolute and relative difference per variable
  troupe bench allreduce [--replicas N] [--sizes 8,64K,1M,16M,64M]
         [--algorithm ring|tree|reduce_to_one|all] [--iterations K] [--json]
         [--mpi auto|off|on]  time in-process all-reduce across N reducers;
                              with OpenMPI, MPI_Allreduce in N processes too
  troupe bench kernels [--seconds S] [--json]
                              the CPU kernels' rates on one thread: oneDNN's
                              dense products in GFLOP/s against the core's
                              estimated peak, troupe's loops in GB/s at every
                              instruction-set level the CPU has
  troupe bench allreduce --algorithm nccl [--devices cuda:0,cuda:1,...]
         [--sizes ...] [--iterations K] [--op sum|mean] [--json]
                              time NCCL all-reduce on the GPUs (default: every
                              visible one; time, algbw, busbw per size); sim:N
                              or cpu:N devices time the host emulation, not NCCL
  troupe --help | --version

run options:
  --output DIR   where metrics.jsonl, summary.json and checkpoints go
                 (default: logging.output_dir, else runs/<name>)
  --resume       continue from the latest checkpoint in checkpoint.dir
  --overwrite    start over, deleting checkpoints an earlier run left there
  --trace FILE   write a timeline of every actor and device thread to FILE
                 (Chrome trace-event JSON: open it in Perfetto or
                 chrome://tracing); a node writes its own file
  --tensorboard DIR
                 also write the metrics as TensorBoard event files under DIR
                 (logging.tensorboard, logging.tensorboard_dir; a node: the chief)
  --quiet        no progress line, warnings and errors only
Exit status: 0 on success, 1 when the job fails, 2 on bad usage or config;
after a signal (SIGINT, SIGTERM, SIGUSR1): 75 when training stopped with a
checkpoint (run the command again to resume), 128+signal (130 for Ctrl-C,
143 for SIGTERM) when it stopped at once before or after training or at a
second signal. troupe launch forwards them to its tasks; its status: theirs.
)";

int bad_usage(const std::string& why) {
  std::cerr << "troupe: " << why << "\n\n" << usage;
  return 2;
}

spdlog::level::level_enum level_from(const std::string& s) {
  auto l = spdlog::level::from_str(s);
  return l;
}

// Progress: one line rewritten in place on a terminal, plain lines otherwise.
struct progress_printer {
  bool tty = isatty(fileno(stderr)) != 0;
  bool quiet = false;
  bool dirty = false;
  // "step 120/1000 (12.0%)  epoch 1/2  loss ...", or, for a job that stops
  // on its own grounds, "update 120  env steps ...  loss ..."; the middle is
  // the strategy's progress measure.
  void step(const troupe::progress_info& p) {
    if (quiet) return;
    std::string line = p.unit + " " + std::to_string(p.step);
    char buf[256];
    if (p.total_steps > 0) {
      double pct = 100.0 * static_cast<double>(p.step) / static_cast<double>(p.total_steps);
      std::snprintf(buf, sizeof buf, "/%lld (%5.1f%%)", static_cast<long long>(p.total_steps), pct);
      line += buf;
    }
    if (!p.measure.empty()) line += "  " + p.measure;
    std::snprintf(buf, sizeof buf, "  loss %.4f  %.0f samples/s  elapsed %.1fs", p.loss,
                  p.samples_per_second, p.elapsed_seconds);
    line += buf;
    if (p.total_steps > 0 && p.step > 0) {
      double eta = p.elapsed_seconds / static_cast<double>(p.step) *
                   static_cast<double>(p.total_steps - p.step);
      std::snprintf(buf, sizeof buf, "  eta %.1fs", eta);
      line += buf;
    }
    print(line.c_str());
  }
  void print(const char* buf) {
    if (tty) {
      std::fprintf(stderr, "\r\033[K%s", buf);
      dirty = true;
    } else {
      std::fprintf(stderr, "%s\n", buf);
    }
    std::fflush(stderr);
  }
  void clear() {
    if (dirty) std::fprintf(stderr, "\r\033[K");
    dirty = false;
  }
  void epoch(const nlohmann::json& j) {
    if (quiet) return;
    clear();
    std::string line = "epoch " + std::to_string(j.value("epoch", 0) + 1);
    for (auto k : {"train_loss", "train_accuracy", "test_loss", "test_accuracy"})
      if (j.contains(k)) {
        char b[64];
        std::snprintf(b, sizeof b, "  %s %.4f", k, j[k].get<double>());
        line += b;
      }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
};

// A job a signal stopped with its checkpoint: the line, and "resume me".
int say_preempted(const nlohmann::json& s) {
  std::printf(
      "job %s preempted by %s at step %lld; checkpoint %s\nrun the same command again to "
      "resume (exit status %d)\n",
      s.value("job", "").c_str(), s.value("preempted", "").c_str(),
      static_cast<long long>(s.value("steps", 0)), s.value("checkpoint", "").c_str(),
      troupe::preemption::kResumeExitStatus);
  return troupe::preemption::kResumeExitStatus;
}

// The job's last lines on stdout and its exit status, from the summary `s`
// of this process's run (a task other than the chief only says it ended).
int say_finished(const nlohmann::json& s, bool node, const troupe::task_id& task) {
  if (node && task.job != "chief") {
    std::printf("task %s finished: the chief ended the job\n", task.str().c_str());
    // Every task of a preempted job asks to be started again.
    return troupe::preemption::requested() || s.contains("preempted")
               ? troupe::preemption::kResumeExitStatus
               : 0;
  }
  if (s.contains("preempted")) return say_preempted(s);
  if (s.contains("env_steps")) {
    std::printf(
        "job %s finished: strategy %s on %s, %lld updates, %lld env steps, %lld episodes, mean "
        "return (last 100) %.1f, %s, %.0f env steps/s, %.1f s\nsummary: %s/summary.json\n",
        s.value("job", "").c_str(), s.value("strategy", "").c_str(), s.value("env", "").c_str(),
        static_cast<long long>(s.value("updates", 0)),
        static_cast<long long>(s.value("env_steps", 0)),
        static_cast<long long>(s.value("episodes", 0)), s.value("mean_return_100", 0.0),
        s.value("solved", false)
            ? ("solved in " + std::to_string(s.value("time_to_solve_seconds", 0.0)) + " s").c_str()
            : "not solved",
        s.value("env_steps_per_second", 0.0), s.value("wall_seconds", 0.0),
        s.value("output_dir", "").c_str());
    return 0;
  }
  std::printf(
      "job %s finished: strategy %s, %lld steps (%.2f epochs), test accuracy %.4f, "
      "test loss %.4f, %.0f samples/s, %.1f s\nsummary: %s/summary.json\n",
      s.value("job", "").c_str(), s.value("strategy", "").c_str(),
      static_cast<long long>(s.value("steps", 0)), s.value("epochs", 0.0),
      s.value("test_accuracy", 0.0), s.value("test_loss", 0.0), s.value("samples_per_second", 0.0),
      s.value("wall_seconds", 0.0), s.value("output_dir", "").c_str());
  return 0;
}

// troupe node without --task: the rank from the environment and the cluster
// from the rendezvous at the chief (net/rendezvous.hpp). 0, or the exit
// code of the failure it reported.
int join_cluster_from_environment(troupe::job_config& cfg, const std::string& file,
                                  troupe::task_id& task) {
  try {
    task = troupe::join_cluster_from_environment(cfg, troupe::process_environment());
    return 0;
  } catch (const troupe::cluster_env_error& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 2;
  } catch (const troupe::config_error& e) {
    std::cerr << "troupe: " << file << ": " << e.what() << "\n";
    return 2;
  } catch (const troupe::secret_error& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "troupe: job '" << cfg.name << "' could not form its cluster: " << e.what()
              << "\n";
    return 1;
  }
}

// troupe node --task NAME started by troupe launch with a job CA: its
// certificate over the socket in TROUPE_ENROL_FD (net/launch_enrol.hpp),
// kept for its links as the rendezvous keeps a rank's. 0 without the
// variable or once enrolled; 2 when the variable or the enrolment is bad.
int enrol_with_launcher(const troupe::task_id& task) {
  namespace enrol = troupe::launch_enrol;
  const char* fd_text = std::getenv(enrol::kFdVariable);
  if (!fd_text) return 0;
  try {
    const int fd = enrol::fd_of_variable(fd_text);
    ::unsetenv(enrol::kFdVariable);  // the socket is used up; nothing below inherits it
    auto id = enrol::enrol(fd, task.str(), std::chrono::seconds(30));
    spdlog::info("{}: enrolled with troupe launch: the job CA issued its certificate", task.str());
    troupe::issued_identity::keep(std::move(id));
    return 0;
  } catch (const troupe::job_ca_error& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 2;
  }
}

// `run` and `node` share their options, progress output and exit codes.
int cmd_run(const std::vector<std::string>& args, bool node) {
  const char* cmd = node ? "node" : "run";
  std::string file;
  std::string task_name;
  troupe::job_options opts;
  bool quiet = false;
  std::string tensorboard_dir;
  troupe::cli::option_parser options(cmd);
  options.config_file(file, node, std::string(cmd) + " needs a config file")
      .value("--output", opts.output_dir, "--output needs a directory")
      .flag("--resume", opts.resume)
      .flag("--overwrite", opts.overwrite)
      .exclusive("--resume", "--overwrite")
      .flag("--quiet", quiet)
      .value("--trace", opts.trace_path, "--trace needs a file, e.g. trace.json")
      .value("--tensorboard", tensorboard_dir, "--tensorboard needs a directory");
  if (node) options.value("--task", task_name, "--task needs a task name, e.g. worker:0");
  if (auto why = options.parse(args)) return bad_usage(*why);
  troupe::task_id task;
  if (node && !task_name.empty()) {
    try {
      task = troupe::parse_task_name(task_name);
    } catch (const std::invalid_argument& e) {
      return bad_usage(std::string("--task: ") + e.what());
    }
  }
  troupe::job_config cfg;
  try {
    cfg = troupe::load_job_config(file);
  } catch (const troupe::config_error& e) {
    std::cerr << "troupe: " << (e.path().empty() ? "" : file + ": ") << e.what() << "\n";
    return 2;
  }
  if (!tensorboard_dir.empty()) {
    cfg.logging.tensorboard = true;
    cfg.logging.tensorboard_dir = tensorboard_dir;
  }
  try {
    (void)troupe::kernels::requested_isa();  // a bad TROUPE_CPU_ISA is a usage error
  } catch (const std::invalid_argument& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 2;
  }
  spdlog::set_level(quiet ? spdlog::level::warn : level_from(cfg.logging.level));
  const bool from_environment = node && task_name.empty();
  if (from_environment && cfg.cluster && !cfg.cluster->tasks.empty())
    return bad_usage(
        "node needs --task NAME (chief, worker:N, ps:N), or a config without cluster.tasks to "
        "take the cluster from the environment");
  // Tests run troupe as a process and name its faults in the environment.
  opts.faults = troupe::faults_from_environment(opts.faults);
  troupe::install_process_faults(troupe::faults_or_none(opts.faults));
  // SIGINT, SIGTERM, SIGUSR1 from here on: runtime/stop_policy.hpp's table.
  namespace stops = troupe::stop_policy;
  stops::install_signal_handlers();
  stops::guard stop_guard(cfg.cluster ? cfg.cluster->grace_seconds
                                      : troupe::cluster_spec{}.grace_seconds);
  if (from_environment) {
    stops::enter(stops::phase::rendezvous);
    if (int rc = join_cluster_from_environment(cfg, file, task); rc != 0) return rc;
  } else if (node) {
    if (int rc = enrol_with_launcher(task); rc != 0) return rc;
  }
  stops::enter(stops::phase::loading);
  progress_printer pp;
  pp.quiet = quiet;
  opts.on_progress = [&pp](const troupe::progress_info& p) { pp.step(p); };
  opts.on_epoch = [&pp](const nlohmann::json& j) { pp.epoch(j); };
  try {
    auto s = node ? troupe::run_node(cfg, task, opts) : troupe::run_job(cfg, opts);
    pp.clear();
    return say_finished(s, node, task);
  } catch (const troupe::config_error& e) {
    pp.clear();
    std::cerr << "troupe: " << file << ": " << e.what() << "\n";
    return 2;
  } catch (const troupe::secret_error& e) {
    pp.clear();
    std::cerr << "troupe: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    pp.clear();
    // A task stopping on a signal whose chief stopped at once (it had nothing
    // to keep) loses the chief: it ends as the chief did, not as a failure.
    if (const int signal = stops::received(); signal && node && task.job != "chief") {
      spdlog::warn("{}: the chief left while this task stopped ({}); exiting with status {}",
                   troupe::preemption::signal_name(signal), e.what(), stops::status_after(signal));
      return stops::status_after(signal);
    }
    std::cerr << "troupe: job '" << cfg.name << "' failed: " << e.what() << "\n";
    return 1;
  }
}

int cmd_validate(const std::vector<std::string>& args) {
  if (args.size() != 1) return bad_usage("validate takes one config file");
  try {
    auto cfg = troupe::load_job_config(args[0]);
    troupe::check_model_against_data(cfg);  // layers: their shapes against the data
    std::cout << troupe::to_json(cfg).dump(2) << "\n";
    std::cerr << args[0] << ": valid\n";
    return 0;
  } catch (const troupe::config_error& e) {
    std::cerr << "troupe: " << (e.path().empty() ? "" : args[0] + ": ") << e.what() << "\n";
    return 2;
  } catch (const troupe::job_error& e) {
    std::cerr << "troupe: " << args[0] << ": " << e.what() << "\n";
    return 1;
  }
}

int cmd_checkpoint(const std::vector<std::string>& args) {
  if (args.empty()) return bad_usage("checkpoint needs 'show DIR' or 'diff A B'");
  try {
    if (args[0] == "show" && args.size() == 2) return troupe::checkpoint::show(args[1], std::cout);
    if (args[0] == "diff" && args.size() == 3)
      return troupe::checkpoint::diff(args[1], args[2], std::cout);
  } catch (const std::exception& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 1;
  }
  return bad_usage("checkpoint needs 'show DIR' or 'diff A B'");
}

int cmd_bench(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "kernels")
    return troupe::run_kernels_bench({args.begin() + 1, args.end()}, std::cout, std::cerr);
  if (args.empty() || args[0] != "allreduce")
    return bad_usage("bench needs 'allreduce' or 'kernels'");
  return troupe::run_allreduce_bench({args.begin() + 1, args.end()}, std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("troupe");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return bad_usage("no command given");
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << usage;
    return 0;
  }
  if (cmd == "--version") {
    std::cout << "troupe " << TROUPE_VERSION << "\n";
    return 0;
  }
  if (cmd == "run") return cmd_run(args, false);
  if (cmd == "node") {
    const int rc = cmd_run(args, true);
    if (troupe::node_system_left_running()) {
      // Its threads still wait inside CAF: end without static destructors.
      spdlog::default_logger()->flush();
      std::cout.flush();
      std::fflush(nullptr);
      std::_Exit(rc);
    }
    return rc;
  }
  if (cmd == "validate") return cmd_validate(args);
  if (cmd == "launch") return troupe::launch::cmd_launch(args, bad_usage);
  if (cmd == "checkpoint") return cmd_checkpoint(args);
  if (cmd == "bench") return cmd_bench(args);
  if (cmd == "report") return troupe::report::cmd_report(args, bad_usage);
  return bad_usage("unknown command '" + cmd + "'");
}
