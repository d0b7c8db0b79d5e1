#pragma once
// The job: everything `troupe run` needs, as parsed and validated from JSON.
// Every field has a default, so a minimal config is a few lines; see
// config/schema.cpp for the JSON names and config_error for bad input.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/cluster.hpp"
#include "config/reducer_links.hpp"

namespace troupe {

// Thrown for any bad config: `path` is the JSON path (e.g. "strategy.replicas"),
// what() is the full message "strategy.replicas: expected an integer >= 1, got -1".
class config_error : public std::runtime_error {
 public:
  config_error(std::string path, const std::string& message)
      : std::runtime_error(path.empty() ? message : path + ": " + message),
        path_(std::move(path)) {}
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

struct model_config {
  std::string kind = "mlp";
  std::vector<int64_t> hidden = {256, 256};
  std::string activation = "relu";  // relu | tanh
  std::string init = "auto";        // auto (he for relu, glorot for tanh) | he | glorot
  // kind "layers": the layers (models/layers/, checked against the data's
  // shape when the job is planned) and the loss:
  // softmax_cross_entropy | binary_cross_entropy | mse.
  nlohmann::json layers;
  std::string loss = "softmax_cross_entropy";
};

struct schedule_config {
  std::string kind = "constant";  // constant | step | cosine
  int64_t warmup_steps = 0;       // linear warm-up from 0 before the schedule
  int64_t step_size = 1000;       // step: decay every step_size steps
  double gamma = 0.1;             // step: multiply by gamma
  int64_t decay_steps = 0;        // cosine: 0 = total training steps
  double min_lr = 0.0;            // cosine: floor
};

struct optimizer_config {
  std::string kind = "adam";  // sgd | momentum | adam | rmsprop
  double learning_rate = 0.001;
  double momentum = 0.9;  // momentum
  bool nesterov = false;  // momentum
  double beta1 = 0.9;     // adam
  double beta2 = 0.999;   // adam
  double epsilon = 1e-8;  // adam, rmsprop
  double rho = 0.9;       // rmsprop: decay of the mean square
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW-style; else L2 added to the gradient
  schedule_config schedule;
};

// One split's files (data.train, data.test) for the formats other than idx.
// Paths are used as written: relative ones are relative to the working
// directory, as data.path is.
struct data_split_files {
  std::string file;  // npz, csv: the split's file
  std::string x, y;  // npy: the examples' and the labels' .npy files
};

struct data_config {
  // idx: Fashion-MNIST's IDX files in `path`; npy: data.{train,test}.{x,y};
  // npz: data.{train,test} archives holding the arrays x_key and y_key;
  // csv: data.{train,test} tables with the label in column `label`.
  std::string format = "idx";
  std::string dataset = "fashion_mnist";                   // idx
  std::string path = "/usr/share/datasets/fashion-mnist";  // idx
  data_split_files train, test;                            // npy, npz, csv
  std::string x_key = "x", y_key = "y";                    // npz
  std::string label;                                       // csv: the label column
  int64_t classes = 0;       // 0 = max label + 1 over both splits (idx: 10)
  bool standardize = false;  // per-feature (x - mean) / std, fitted on the training split
  int64_t batch_size = 128;  // the global batch
  bool shuffle = true;
  // Byte examples (idx; npy/npz uint8): scale to [0,1], then (x - mean) / std
  // with one mean and std over every training byte. Other examples are used
  // as they are (see standardize).
  bool normalize = true;
  int64_t prefetch = 2;  // batches prepared ahead per pipeline
  // Where batches are gathered: "pipeline" (the input pipeline's own thread),
  // "device" (background work of the process's device threads, done by
  // whichever is idle: in a synchronous step, the replica that finished
  // first), "step" (each replica's step task copies its own rows, on its
  // device, right before it computes on them), or "auto": "step" for
  // mirrored with device collectives on host devices (its step keeps the
  // device busy from one step to the next, so a gather left for its idle
  // moments would wait, and one on another thread takes a core from a
  // replica that its peers then wait for); "device" for other synchronous
  // strategies (mirrored, central_storage) when a process runs as many device
  // threads as it has cores; else "pipeline".
  std::string gather = "auto";
  // Where the training set lives while a strategy that can (one_device)
  // trains on a discrete device (sim:N, cuda:N): "device" (uploaded once,
  // each step's rows gathered there by index: models/resident_steps.hpp),
  // "host" (batches gathered on the host and uploaded each step), or "auto":
  // "device" when the set fits in half the device's free memory.
  std::string placement = "auto";
  int64_t train_limit = 0;  // 0 = all; else use only the first N training examples
  int64_t test_limit = 0;   // 0 = all
};

// How mirrored (and actor_learner's learners) sum gradients: the reducer
// actors' ring, tree or reduce_to_one (actors/reducer.hpp), or `device`:
// the devices' own collectives (NCCL on cuda, shared memory between the
// replicas of a process on cpu and sim; collectives/process_group.hpp).
enum class reducer_algorithm { ring, tree, reduce_to_one, device };

// "ring", "tree", "reduce_to_one", "device".
const char* name_of(reducer_algorithm a);
// The value a name stands for ("nccl": device, its former name); throws
// std::invalid_argument for any other name, naming it.
reducer_algorithm parse_reducer_algorithm(const std::string& name);

struct reducer_settings {
  reducer_algorithm algorithm = reducer_algorithm::ring;
  int64_t bucket_bytes = 4 << 20;  // gradients fused into buckets of about this size
  int64_t chunk_bytes = 1 << 20;   // ring pipelining granularity
  // device across processes: false = one NCCL communicator over every
  // replica of the job (its ncclUniqueId sent by the chief); true = NCCL in
  // each process and the CAF ring across them. cpu/sim devices are always
  // hierarchical (their group is in-process).
  bool hierarchical = false;
  // Device collectives across processes with a ring between the processes
  // (cpu/sim devices, or hierarchical cuda).
  reducer_transport transport = reducer_transport::direct;
  // On the direct links: fp32, or bf16 (half the bytes; sums in fp32).
  wire_format wire = wire_format::fp32;
  // Direct links between processes of one host (and network namespace).
  same_host_link same_host = same_host_link::shared_memory;
  // On the direct links: how long a thread waiting for its peer gives its
  // core away between looks before it sleeps (collectives/idle_wait.hpp).
  int64_t yield_us = 3000;
};

// How variables are spread over variable shards (actors/partitioner.hpp).
struct partitioner_config {
  // round_robin | greedy_bytes | fixed_shards | min_max_bytes
  std::string kind = "round_robin";
  int64_t max_shard_bytes = 0;          // min_max_bytes: split variables larger than this
  int64_t min_slice_bytes = 256 << 10;  // min_max_bytes: never make smaller pieces
  int64_t fixed_shards = 0;             // fixed_shards: pieces per variable; 0 = shards
};

// The strategy's settings. Which strategy.* keys a strategy accepts, their
// defaults and rules are its file's (strategies/<kind>.cpp, through
// config/strategy_keys.hpp): a key given to a strategy that does not list it
// is an error. The fields below are the settings of the built-in strategies
// that the runtime reads (their defaults are the initializers); a strategy
// added later keeps its own keys in `options`.
struct strategy_config {
  // A registered strategy (strategies/*.cpp, or one a program registers).
  std::string kind = "one_device";
  // Replicas (mirrored, central_storage) or workers (parameter_server).
  // The config may say "auto": one replica per device listed in `devices`,
  // or, when `devices` is not given, one per CPU core this process may run on
  // (resolved when the config is read; replicas_auto remembers it).
  int64_t replicas = 1;
  bool replicas_auto = false;
  // Gradient accumulation: micro-batches per update (effective batch = batch_size * R).
  int64_t steps_per_update = 1;
  reducer_settings reducer;
  // mirrored: each replica updates only its reduce-scatter segments of the
  // variables (and keeps only those optimizer slots current), then an
  // all-gather spreads them (ZeRO stage 1); false = every replica all-reduces
  // the gradients and applies the whole update itself.
  bool shard_optimizer = true;
  // central_storage, parameter_server: variable shards holding the variables
  // and their optimizer slots, and how variables are placed on them.
  int64_t shards = 1;
  partitioner_config partitioner;
  // parameter_server: how many steps the fastest worker may be ahead of the
  // slowest (0 = bulk-synchronous; -1 = unbounded, fully asynchronous).
  int64_t max_staleness = -1;
  // elastic_average (EASGD): every communication_period local steps a worker
  // exchanges with the center: d = moving_rate * (x - c); x -= d; c += d.
  int64_t communication_period = 8;
  double moving_rate = 0;  // 0 = 0.9 / communication_period / workers
  // Elastic force in every local step: g += rho * (x - c_last) (0 = none: a
  // force of moving_rate / learning_rate, the paper's coupling, explodes for
  // small learning rates).
  double rho = 0;
  bool synchronous = false;  // all workers exchange in one round every period
  // mirrored: verify the replicas' variables are bit-identical every N steps
  // and at the end (0 = only at the end; -1 = never).
  int64_t check_replicas_every = 0;
  // The keys of strategies that have no field above, by name, as their
  // strategy_option (config/strategy_keys.hpp) read them.
  nlohmann::json options = nlohmann::json::object();
};

struct training_config {
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0 = no limit; else stop after this many steps
  // Steps handed to the replicas in one request (Keras' steps_per_execution):
  // a step that is device work alone runs them as one device task, so the
  // runtime's hand-overs happen once per execution. Lockstep strategies.
  // Each replica holds the batches of two executions. kAutoSteps ("auto"):
  // the driver sizes executions from the measured time per step.
  static constexpr int64_t kMaxStepsPerExecution = 1024;
  static constexpr int64_t kAutoSteps = 0;
  int64_t steps_per_execution = 1;
  // "auto": steps on a device-resident data set are captured as graphs
  // (CUDA graphs on cuda:N) and replayed; "off": every step's launches are
  // issued from the host.
  std::string step_graphs = "auto";
  // Where FP32 work may run on TF32 tensor cores (Ampere and later GPUs):
  // "convolutions" (PyTorch's default: cuDNN may, cuBLAS may not), "all"
  // (matrix products too) or "off" (plain FP32 everywhere, within ~1e-6
  // relative of the CPU). CPUs and sim devices ignore it.
  std::string tf32 = "convolutions";
  int64_t eval_every_epochs = 1;
  // actor_learner: stop after this many environment steps (0 = no limit) or
  // once the mean return of the last 100 episodes reaches target_return.
  int64_t max_env_steps = 0;
  std::optional<double> target_return;
};

// rl.env as an object ({"kind": "gymnasium", ...}): an environment from
// Gymnasium's registry, or a user's gymnasium.Env class, stepped by a Python
// worker process (envs/python_env.hpp).
struct gymnasium_env_config {
  std::string id;                  // e.g. "CartPole-v1"
  std::string kwargs = "{}";       // a JSON object: gymnasium.make(id, **kwargs)
  std::string entry_point;         // "package.module:Class", registered as id; "" = none
  std::string python = "python3";  // the interpreter (a venv's bin/python)
  // A JSON array of Gymnasium wrappers applied in the worker, innermost
  // first: "name", "name:arg" or {"name": ..., "kwargs": {...}}
  // (envs/python/troupe_env_worker.py's WRAPPERS; an unknown name is refused
  // at the job's start).
  std::string wrappers = "[]";
};

// rl.env as {"kind": "plugin", ...}: an environment from a shared library
// exporting troupe's C ABI (envs/troupe_env_plugin.h, envs/plugin_env.hpp).
// A relative `library` is resolved against the config file's directory when
// the file is there (load_job_config), else against the build's plugin
// directory, else left to the dynamic linker's search.
struct plugin_env_config {
  std::string library;        // the .so's path
  std::string id;             // the kind of environment the library makes
  std::string kwargs = "{}";  // a JSON object, passed to the plugin's create()
};

// actor_learner (strategies/actor_learner.cpp): rl_actors stepping
// environments, learners training on their unrolls with V-trace.
// Ape-X DQN's replay (rl.algorithm "apex_dqn"): N prioritized shards, the
// actors' exploration and the learner's double-DQN settings.
struct replay_config {
  int64_t shards = 2;
  int64_t capacity = 100000;  // transitions per shard
  double alpha = 0.6;         // priority exponent (0: uniform)
  double beta = 0.4;          // importance-weight exponent
  int64_t n_step = 3;
  int64_t min_size = 1000;     // transitions a shard holds before it is sampled
  int64_t batch_size = 256;    // transitions per update (per learner)
  int64_t target_every = 100;  // updates between copies into the target network
  // Each shard's rate limiter: transitions sampled per transition inserted
  // past min_size, at least (0: no limit; actors then outpace the learner).
  double samples_per_insert = 4;
  double epsilon = 0.4;  // actor i of N: epsilon^(1 + i / (N - 1) * epsilon_alpha)
  double epsilon_alpha = 7.0;
};

// rl.inference "central": how the inference server batches requests. A
// batch runs once it holds max_batch rows, every live actor has asked, or
// max_wait_us passed since its first request. An actor of the server's
// process that waits for its batch yields its core for yield_us before it
// sleeps (actors/inference_batcher.hpp).
struct central_inference_config {
  int64_t max_batch = 4096;  // rows (environments) per forward
  int64_t max_wait_us = 2000;
  int64_t yield_us = 200;
  // The server's forward on a discrete device ("sim:N", "cuda:N"); "" (or
  // "cpu:N"): the host's kernels.
  std::string device;
};

// rl.population: population-based training (Jaderberg et al. 2017,
// strategies/population.cpp). One hyperparameter's start in each member: the
// job's own value ("job"), member i's from `values`, or drawn from the job's
// seed, uniformly or log-uniformly in [min, max]. A resample draws from the
// same distribution; explore keeps a perturbed value inside [min, max] (the
// values' range for "values"; no bound for "job").
struct population_hyperparameter {
  std::string sampling = "job";  // job | values | uniform | log_uniform
  std::vector<double> values;    // "values": one per member
  double min = 0, max = 0;       // "uniform", "log_uniform"; the values' range
};

struct population_config {
  int64_t size = 0;  // members (learner groups); 0: no population
  int64_t interval_env_steps = 100000;
  // Exploit (truncation selection): every member in the bottom `quantile`
  // by recent mean return takes the weights and optimizer state of one in
  // the top `quantile`.
  double quantile = 0.25;
  // Explore: each copied hyperparameter is multiplied by one of `factors`
  // (chosen evenly), or with `resample_probability` drawn afresh.
  std::vector<double> factors{0.8, 1.2};
  double resample_probability = 0;
  population_hyperparameter learning_rate, entropy_cost;
};

struct rl_config {
  // "impala" (V-trace on unrolls through the trajectory queue) or
  // "apex_dqn" (double DQN on transitions through prioritized replay shards).
  std::string algorithm = "impala";
  replay_config replay;
  // A registered environment (envs/env.hpp), or with `gymnasium` (or
  // `plugin`) set the id it names.
  std::string env = "CartPole-v1";
  std::optional<gymnasium_env_config> gymnasium;
  std::optional<plugin_env_config> plugin;
  int64_t actors = 2;           // rl_actors
  int64_t envs_per_actor = 32;  // M: environments each actor steps together
  int64_t unroll_length = 20;   // T: steps per unroll
  int64_t batch_unrolls = 4;    // B: unrolls per update, over all learners
  double discount = 0.99;
  // Rewards are multiplied by this in the learner (values then stay near 1
  // for long episodes, where the optimizer's step bounds how fast the value
  // head can grow); returns are reported unscaled.
  double reward_scale = 1.0;
  double rho_bar = 1.0;  // V-trace: clip of the importance weights
  double c_bar = 1.0;    // V-trace: clip of the trace coefficients
  double baseline_cost = 0.5;
  double entropy_cost = 0.01;
  // The policy head: "auto" (the one the environment's action space takes),
  // "softmax" (discrete actions) or "gaussian" (a Box).
  std::string policy_head = "auto";
  double initial_log_std = 0.0;  // gaussian: the log-std's start
  // The policy/value network's torso: "auto" (the conv torso for image
  // observations, [C,H,W] or [H,W], under the default model.kind; else
  // model as given), "mlp" (model as given) or "nature_cnn" (conv 32x8x8/4,
  // 64x4x4/2, 64x3x3/1, dense 512; envs/torso.hpp).
  std::string torso = "auto";
  bool normalize_advantages = false;  // per learner batch, before the loss
  double grad_clip = 40.0;            // global-norm clip of the gradients; 0 = none
  int64_t learners = 1;               // data-parallel learners (B split between them)
  int64_t weights_every = 1;          // learners publish weights every K updates
  int64_t max_policy_lag = -1;        // drop unrolls older than this many versions; -1 = keep all
  int64_t queue_capacity = 8;         // unrolls the trajectory queue holds
  // "local" (each rl_actor runs its own copy of the policy) or "central"
  // (SEED RL: rl_actors send observations to one inference server beside
  // the learner, actors/inference_server.hpp).
  std::string inference = "local";
  central_inference_config central;
  population_config population;  // size 0: no population
};

struct checkpoint_config {
  std::string dir;          // "" = <output>/checkpoints
  int64_t every_steps = 0;  // 0 = only at the end
  int64_t keep = 3;         // most recent checkpoints kept; 0 = keep all
  bool save_at_end = true;
  // elastic_average: also save every worker's own variables, as
  // "local/<worker>/<variable>" entries beside the slots (the model saved is
  // the center).
  bool save_local_copies = false;
};

struct logging_config {
  std::string level = "info";  // trace | debug | info | warn | error | off
  int64_t every_steps = 50;    // metrics line + progress every N steps
  std::string output_dir;      // "" = runs/<name>
  // The metrics lines as TensorBoard event files too, one run directory per
  // role under tensorboard_dir ("" = <output>/tensorboard).
  bool tensorboard = false;
  std::string tensorboard_dir;
  // GET /metrics (Prometheus) and /healthz on every process of the job:
  // 0 = off, a port, or kMetricsPortAuto ("auto": one the OS picks, written
  // to <output>/metrics_port). Outside the cluster gate; read-only.
  static constexpr int64_t kMetricsPortAuto = -1;
  int64_t metrics_port = 0;
  std::string metrics_address = "127.0.0.1";  // a numeric IPv4 or IPv6 address
};

struct job_config {
  std::string name = "job";
  uint64_t seed = 42;
  model_config model;
  optimizer_config optimizer;
  data_config data;
  strategy_config strategy;
  std::vector<std::string> devices = {"cpu:0"};
  training_config training;
  rl_config rl;
  bool rl_given = false;  // the config has an "rl" section
  checkpoint_config checkpoint;
  logging_config logging;
  // Multi-process jobs only: the tasks, their addresses and what each hosts
  // (config/cluster.hpp). Absent = a single-process job.
  std::optional<cluster_spec> cluster;
};

// Parses and validates; throws config_error naming the JSON path.
// Unknown keys are errors, with "did you mean 'x'?" when one is close.
job_config parse_job_config(const nlohmann::json& j);

// What a model kind computes: a classifier of a dataset's examples
// (models/model.hpp) or a policy and a value over an environment's
// observations (models/policy_value.hpp).
enum class model_family { classifier, policy_value };
// The model kinds a job config may name (model.kind), with their family:
// models/ registers every kind it can build here, its built-ins included, so
// this list is the model registries' own. Registering a kind again with the
// same family does nothing; with another, throws std::invalid_argument.
void register_model_kind(const std::string& kind, model_family family);
// Sorted.
std::vector<std::string> known_model_kinds();
std::vector<std::string> model_kinds_of(model_family family);

// CPU cores this process may run on (its affinity mask), at least 1: what
// "replicas": "auto" counts.
int64_t usable_cpu_cores();

// A config saved by troupe (a checkpoint manifest's, summary.json's): as
// parse_job_config, except that strategy keys of other strategies are
// dropped, not refused (troupe wrote every strategy's keys before each
// strategy declared its own).
job_config parse_saved_job_config(nlohmann::json j);

// Reads the file; a missing file or bad JSON is a config_error too (path "" /
// the message names the file and the line/column of the syntax error).
job_config load_job_config(const std::string& file);
// The same from the file's text (`file` only names it in messages); a text
// nested more than kMaxJsonDepth (config/json_limits.hpp) deep is refused
// before it is parsed.
job_config parse_job_config_text(const std::string& text, const std::string& file);
// The effective config with every default filled in (for summary.json and
// checkpoint manifests).
nlohmann::json to_json(const job_config& c);

}  // namespace troupe
