#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "config/job_config.hpp"
#include "tests/fuzz/mutate.hpp"
#include "tests/fuzz/targets.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

// The what() of parsing `text`, or "" when it parses.
std::string error_of(const std::string& text) {
  try {
    parse_job_config(json::parse(text));
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

struct bad_case {
  const char* config;
  const char* message;
};

const bad_case kBad[] = {
    // root and unknown keys
    {R"([1, 2])", R"((root): expected a JSON object, got array)"},
    {R"("x")", R"((root): expected a JSON object, got string)"},
    {R"({"optimizr": {}})", R"(optimizr: unknown key; did you mean "optimizer"?)"},
    {R"({"devise": ["cpu:0"]})", R"(devise: unknown key; did you mean "devices"?)"},
    {R"({"zzz": 1})",
     R"(zzz: unknown key (expected one of: "name", "seed", "model", "optimizer", "data", "strategy", "devices", "training", "rl", "checkpoint", "logging", "cluster"))"},
    {R"({"optimizer": {"lerning_rate": 0.1}})",
     R"(optimizer.lerning_rate: unknown key; did you mean "learning_rate"?)"},
    {R"({"optimizer": {"schedule": {"knd": "step"}}})",
     R"(optimizer.schedule.knd: unknown key; did you mean "kind"?)"},
    {R"({"optimizer": {"lr": 0.1}})",
     R"(optimizer.lr: unknown key (expected one of: "kind", "learning_rate", "momentum", "nesterov", "beta1", "beta2", "epsilon", "rho", "weight_decay", "decoupled_weight_decay", "schedule"))"},
    {R"({"data": {"batchsize": 64}})",
     R"(data.batchsize: unknown key; did you mean "batch_size"?)"},
    // sections of the wrong type
    {R"({"model": []})", R"(model: expected a JSON object, got array)"},
    {R"({"logging": "debug"})", R"(logging: expected a JSON object, got string)"},
    // integers
    {R"({"strategy": {"kind": "mirrored", "replicas": -1}})",
     R"(strategy.replicas: expected an integer >= 1, got -1)"},
    {R"({"data": {"batch_size": "128"}})",
     R"(data.batch_size: expected an integer >= 1, got "128")"},
    {R"({"data": {"batch_size": 1.5}})", R"(data.batch_size: expected an integer >= 1, got 1.5)"},
    {R"({"data": {"batch_size": null}})", R"(data.batch_size: expected an integer >= 1, got null)"},
    {R"({"data": {"batch_size": [64]}})", R"(data.batch_size: expected an integer >= 1, got [64])"},
    {R"({"data": {"prefetch": 0}})", R"(data.prefetch: expected an integer >= 1, got 0)"},
    {R"({"data": {"gather": "gpu"}})",
     R"(data.gather: expected one of "auto", "pipeline", "device", "step", got "gpu")"},
    {R"({"data": {"train_limit": -5}})", R"(data.train_limit: expected an integer >= 0, got -5)"},
    {R"({"data": {"format": "parquet"}})",
     R"(data.format: expected one of "idx", "npy", "npz", "csv", got "parquet")"},
    {R"({"data": {"format": "npy", "path": "/d", "train": {"x": "a", "y": "b"}, "test": {"x": "c", "y": "d"}}})",
     R"(data.path: only the "idx" format reads this key (data.format is "npy"))"},
    {R"({"data": {"train": "t.npz"}})",
     R"(data.train: only the "npy", "npz", "csv" formats read this key (data.format is "idx"))"},
    {R"({"data": {"format": "npy", "test": {"x": "c", "y": "d"}}})",
     R"(data.train: missing; the npy format needs it ({"x": "x_train.npy", "y": "y_train.npy"}))"},
    {R"({"data": {"format": "npz", "train": "a.npz"}})",
     R"(data.test: missing; the npz format needs it ("test.npz"))"},
    {R"({"data": {"format": "csv", "train": "a.csv", "test": "b.csv"}})",
     R"(data.label: missing; the csv format needs it (the name of the label column))"},
    {R"({"data": {"format": "npz", "train": "a", "test": "b", "label": "y"}})",
     R"(data.label: only the "csv" format reads this key (data.format is "npz"))"},
    {R"({"data": {"format": "csv", "train": "a", "test": "b", "label": "y", "x_key": "x"}})",
     R"(data.x_key: only the "npz" format reads this key (data.format is "csv"))"},
    {R"({"data": {"format": "npy", "train": {"x": "a"}, "test": {"x": "c", "y": "d"}}})",
     R"(data.train.y: missing; the npy format reads the examples (x) and the labels (y) from two .npy files)"},
    {R"({"data": {"format": "npy", "train": {"x": "a", "y": "b", "z": 1}, "test": {"x": "c", "y": "d"}}})",
     R"(data.train.z: unknown key (expected one of: "x", "y"))"},
    {R"({"data": {"format": "npy", "train": "a.npy", "test": {"x": "c", "y": "d"}}})",
     R"(data.train: expected an object {"x": "x.npy", "y": "y.npy"} (the npy format), got "a.npy")"},
    {R"({"data": {"format": "npy", "train": {"x": "", "y": "b"}, "test": {"x": "c", "y": "d"}}})",
     R"(data.train.x: expected a non-empty string, got "")"},
    {R"({"data": {"format": "npz", "train": {"x": "a"}, "test": "b"}})",
     R"(data.train: expected a non-empty string, got {"x":"a"})"},
    {R"({"data": {"format": "npz", "train": "a", "test": "b", "y_key": "x"}})",
     R"(data.y_key: the examples and the labels must be different arrays, both are "x")"},
    {R"({"data": {"classes": 0}})", R"(data.classes: expected an integer >= 1, got 0)"},
    {R"({"data": {"standardize": "yes"}})",
     R"(data.standardize: expected true or false, got "yes")"},
    {R"({"model": {"hidden": [64, 0]}})", R"(model.hidden[1]: expected an integer >= 1, got 0)"},
    {R"({"model": {"hidden": 256}})",
     R"(model.hidden: expected an array of integers >= 1, got 256)"},
    {R"({"training": {"epochs": 0}})", R"(training.epochs: expected an integer >= 1, got 0)"},
    {R"({"training": {"steps_per_execution": 0}})",
     R"(training.steps_per_execution: expected an integer in [1, 1024] or "auto", got 0)"},
    {R"({"training": {"steps_per_execution": 1025}})",
     R"(training.steps_per_execution: expected an integer in [1, 1024] or "auto", got 1025)"},
    {R"({"training": {"steps_per_execution": "fast"}})",
     R"(training.steps_per_execution: expected an integer in [1, 1024] or "auto", got "fast")"},
    {R"({"strategy": {"kind": "parameter_server"}, "training": {"steps_per_execution": 8}})",
     R"(training.steps_per_execution: the parameter_server strategy's workers do not take every step together; expected 1 (the default), got 8)"},
    {R"({"training": {"max_steps": 9223372036854775808}})",
     R"(training.max_steps: expected an integer >= 0 (at most 9223372036854775807), got 9223372036854775808)"},
    {R"({"logging": {"every_steps": 0}})",
     R"(logging.every_steps: expected an integer >= 1, got 0)"},
    {R"({"checkpoint": {"keep": -1}})", R"(checkpoint.keep: expected an integer >= 0, got -1)"},
    {R"({"seed": -3})", R"(seed: expected an integer >= 0, got -3)"},
    {R"({"optimizer": {"schedule": {"step_size": 0}}})",
     R"(optimizer.schedule.step_size: expected an integer >= 1, got 0)"},
    // enums
    {R"({"optimizer": {"kind": "adamw"}})",
     R"(optimizer.kind: expected one of "sgd", "momentum", "adam", "rmsprop", got "adamw")"},
    {R"({"optimizer": {"kind": 3}})",
     R"(optimizer.kind: expected one of "sgd", "momentum", "adam", "rmsprop", got 3)"},
    {R"({"model": {"activation": "gelu"}})",
     R"(model.activation: expected one of "relu", "tanh", got "gelu")"},
    {R"({"model": {"kind": "cnn"}})",
     R"(model.kind: expected one of "layers", "mlp", "policy_value_layers", "policy_value_mlp", got "cnn")"},
    {R"({"model": {"kind": "layers"}})",
     R"(model.layers: missing: model.kind "layers" needs its layers)"},
    {R"({"model": {"kind": "layers", "layers": []}})",
     R"(model.layers: expected a non-empty array of layer objects, got [])"},
    {R"({"model": {"layers": [{"type": "relu"}]}})",
     R"(model.layers: only model.kind "layers" or "policy_value_layers" takes layers (got kind "mlp"))"},
    {R"({"model": {"kind": "layers", "layers": [{"type": "relu"}], "loss": "hinge"}})",
     R"(model.loss: expected one of "softmax_cross_entropy", "binary_cross_entropy", "mse", got "hinge")"},
    {R"({"model": {"init": "xavier"}})",
     R"(model.init: expected one of "auto", "he", "glorot", got "xavier")"},
    {R"({"data": {"dataset": "mnist"}})", R"(data.dataset: expected "fashion_mnist", got "mnist")"},
    {R"({"strategy": {"kind": "horovod"}})",
     R"(strategy.kind: expected one of "actor_learner", "central_storage", "elastic_average", "mirrored", "one_device", "parameter_server", got "horovod")"},
    {R"({"optimizer": {"schedule": {"kind": "linear"}}})",
     R"(optimizer.schedule.kind: expected one of "constant", "step", "cosine", got "linear")"},
    {R"({"logging": {"level": "verbose"}})",
     R"(logging.level: expected one of "trace", "debug", "info", "warn", "error", "off", got "verbose")"},
    // real numbers
    {R"({"optimizer": {"learning_rate": 0}})",
     R"(optimizer.learning_rate: expected a number > 0, got 0)"},
    {R"({"optimizer": {"learning_rate": "1e-3"}})",
     R"(optimizer.learning_rate: expected a number > 0, got "1e-3")"},
    {R"({"optimizer": {"momentum": 1.0}})",
     R"(optimizer.momentum: expected a number in [0, 1), got 1.0)"},
    {R"({"optimizer": {"beta2": -0.1}})",
     R"(optimizer.beta2: expected a number in [0, 1), got -0.1)"},
    {R"({"optimizer": {"epsilon": -1e-8}})",
     R"(optimizer.epsilon: expected a number > 0, got -1e-08)"},
    {R"({"optimizer": {"weight_decay": -1}})",
     R"(optimizer.weight_decay: expected a number >= 0, got -1)"},
    {R"({"optimizer": {"schedule": {"gamma": 0}}})",
     R"(optimizer.schedule.gamma: expected a number in (0, 1], got 0)"},
    {R"({"optimizer": {"schedule": {"gamma": 1.5}}})",
     R"(optimizer.schedule.gamma: expected a number in (0, 1], got 1.5)"},
    // booleans and strings
    {R"({"optimizer": {"nesterov": "yes"}})",
     R"(optimizer.nesterov: expected true or false, got "yes")"},
    {R"({"data": {"shuffle": 1}})", R"(data.shuffle: expected true or false, got 1)"},
    {R"({"data": {"path": ""}})", R"(data.path: expected a non-empty string, got "")"},
    {R"({"checkpoint": {"dir": 7}})", R"(checkpoint.dir: expected a string, got 7)"},
    {R"({"name": "a/b"})",
     R"(name: expected a non-empty name of letters, digits, '.', '_' or '-', got "a/b")"},
    {R"({"name": ""})",
     R"(name: expected a non-empty name of letters, digits, '.', '_' or '-', got "")"},
    // devices
    {R"({"devices": ["gpu0"]})", R"(devices[0]: expected "cpu:N" or "cuda:N", got "gpu0")"},
    {R"({"devices": ["cpu:-1"]})", R"(devices[0]: expected "cpu:N" or "cuda:N", got "cpu:-1")"},
    {R"({"devices": ["cuda:"]})", R"(devices[0]: expected "cpu:N" or "cuda:N", got "cuda:")"},
    {R"({"strategy": {"kind": "mirrored"}, "devices": ["cpu:0", 1]})",
     R"(devices[1]: expected "cpu:N" or "cuda:N", got 1)"},
    {R"({"devices": []})",
     R"(devices: expected a non-empty array of "cpu:N" or "cuda:N" strings, got [])"},
    {R"({"devices": "cpu:0"})",
     R"(devices: expected a non-empty array of "cpu:N" or "cuda:N" strings, got "cpu:0")"},
    {R"({"strategy": {"kind": "mirrored"}, "devices": ["cuda:0", "cuda:1", "cuda:0"]})",
     R"(devices[2]: duplicate device "cuda:0" (already devices[0]))"},
    // each strategy's own keys (strategies/<kind>.cpp)
    {R"({"strategy": {"kind": "elastic_average", "moving_rate": 2}})",
     R"(strategy.moving_rate: expected a number in [0, 1], got 2)"},
    {R"({"strategy": {"kind": "elastic_average", "communication_period": 0}})",
     R"(strategy.communication_period: expected an integer >= 1, got 0)"},
    {R"({"strategy": {"kind": "mirrored", "shard_optimizer": "yes"}})",
     R"(strategy.shard_optimizer: expected true or false, got "yes")"},
    {R"({"strategy": {"kind": "parameter_server", "max_staleness": -2}})",
     R"(strategy.max_staleness: expected an integer >= -1, got -2)"},
    {R"({"strategy": {"kind": "central_storage", "partitioner": {"kind": "min_max_bytes"}}})",
     R"(strategy.partitioner.max_shard_bytes: the min_max_bytes partitioner needs a size > 0 to split at, got 0)"},
    {R"({"strategy": {"shards": 2}})",
     R"(strategy.shards: the one_device strategy does not use this key (a key of "central_storage", "elastic_average", "parameter_server"))"},
    {R"({"strategy": {"kind": "mirrored", "moving_rate": 0.5}})",
     R"(strategy.moving_rate: the mirrored strategy does not use this key (a key of "elastic_average"))"},
    {R"({"strategy": {"kind": "parameter_server", "steps_per_update": 2}})",
     R"(strategy.steps_per_update: the parameter_server strategy does not use this key (a key of "central_storage", "mirrored", "one_device"))"},
    {R"({"strategy": {"kind": "mirrored", "replica": 2}})",
     R"(strategy.replica: unknown key; did you mean "replicas"?)"},
    // cross-field rules
    {R"({"strategy": {"replicas": 2}})",
     R"(strategy.replicas: the one_device strategy runs exactly 1 replica, got 2)"},
    {R"({"devices": ["cpu:0", "cpu:1"]})",
     R"(devices: the one_device strategy needs exactly one device, got 2 ("cpu:0", "cpu:1"))"},
    {R"({"strategy": {"kind": "mirrored", "replicas": 4}, "data": {"batch_size": 2}})",
     R"(data.batch_size: the global batch (2) must be >= strategy.replicas (4) so every replica gets at least one example)"},
    {R"({"optimizer": {"learning_rate": 0.01, "schedule": {"kind": "cosine", "min_lr": 0.1}}})",
     R"(optimizer.schedule.min_lr: expected a number <= optimizer.learning_rate (0.01), got 0.1)"},
};

}  // namespace

TEST_CASE("config: every bad config gets its exact message") {
  CHECK(std::size(kBad) >= 25);
  for (const auto& c : kBad) {
    CAPTURE(c.config);
    CHECK(error_of(c.config) == c.message);
  }
}

TEST_CASE("config: the error path names the field") {
  try {
    parse_job_config(json::parse(R"({"model": {"hidden": [1, -2]}})"));
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    CHECK(e.path() == "model.hidden[1]");
  }
}

TEST_CASE("config: {} gives the defaults") {
  job_config c = parse_job_config(json::object());
  job_config d;
  CHECK(c.name == "job");
  CHECK(c.seed == 42);
  CHECK(c.model.kind == "mlp");
  CHECK(c.model.hidden == std::vector<int64_t>{256, 256});
  CHECK(c.model.activation == "relu");
  CHECK(c.model.init == "auto");
  CHECK(c.optimizer.kind == "adam");
  CHECK(c.optimizer.learning_rate == 0.001);
  CHECK(c.optimizer.momentum == 0.9);
  CHECK_FALSE(c.optimizer.nesterov);
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.999);
  CHECK(c.optimizer.epsilon == 1e-8);
  CHECK(c.optimizer.rho == 0.9);
  CHECK(c.optimizer.weight_decay == 0.0);
  CHECK_FALSE(c.optimizer.decoupled_weight_decay);
  CHECK(c.optimizer.schedule.kind == "constant");
  CHECK(c.optimizer.schedule.warmup_steps == 0);
  CHECK(c.optimizer.schedule.step_size == 1000);
  CHECK(c.optimizer.schedule.gamma == 0.1);
  CHECK(c.optimizer.schedule.decay_steps == 0);
  CHECK(c.optimizer.schedule.min_lr == 0.0);
  CHECK(c.data.dataset == "fashion_mnist");
  CHECK(c.data.path == d.data.path);
  CHECK(c.data.batch_size == 128);
  CHECK(c.data.shuffle);
  CHECK(c.data.normalize);
  CHECK(c.data.prefetch == 2);
  CHECK(c.data.gather == "auto");
  CHECK(c.data.train_limit == 0);
  CHECK(c.data.test_limit == 0);
  CHECK(c.strategy.kind == "one_device");
  CHECK(c.strategy.replicas == 1);
  CHECK(c.devices == std::vector<std::string>{"cpu:0"});
  CHECK(c.training.epochs == 1);
  CHECK(c.training.max_steps == 0);
  CHECK(c.training.eval_every_epochs == 1);
  CHECK(c.checkpoint.dir.empty());
  CHECK(c.checkpoint.every_steps == 0);
  CHECK(c.checkpoint.keep == 3);
  CHECK(c.checkpoint.save_at_end);
  CHECK(c.logging.level == "info");
  CHECK(c.logging.every_steps == 50);
  CHECK(c.logging.output_dir.empty());
  // Every field of the effective config is the default.
  CHECK(to_json(c) == to_json(d));
}

TEST_CASE("config: the effective strategy section holds the keys its strategy declares") {
  // Each with its default; no other strategy's key.
  auto strategy_of = [](const char* text) {
    return to_json(parse_job_config(json::parse(text)))["strategy"];
  };
  json one = strategy_of(R"({})");
  CHECK(one == json{{"kind", "one_device"},
                    {"replicas", 1},
                    {"steps_per_update", 1},
                    {"check_replicas_every", 0}});
  json ea = strategy_of(R"({"strategy": {"kind": "elastic_average", "replicas": 2, "rho": 0.5}})");
  CHECK(ea["communication_period"] == 8);
  CHECK(ea["rho"] == 0.5);
  CHECK(ea["synchronous"] == false);
  CHECK(ea["shards"] == 1);
  CHECK(ea["partitioner"]["kind"] == "round_robin");
  CHECK_FALSE(ea.contains("reducer"));
  CHECK_FALSE(ea.contains("steps_per_update"));
  json m = strategy_of(R"({"strategy": {"kind": "mirrored", "shard_optimizer": false}})");
  CHECK(m["shard_optimizer"] == false);
  CHECK(m["reducer"]["algorithm"] == "ring");
  CHECK_FALSE(m.contains("shards"));
  CHECK_FALSE(m.contains("communication_period"));
  // The typed fields the runtime reads are set from the strategy's keys.
  auto c = parse_job_config(json::parse(
      R"({"strategy": {"kind": "elastic_average", "replicas": 2, "communication_period": 3,
                       "moving_rate": 0.25, "synchronous": true, "max_staleness": 1}})"));
  CHECK(c.strategy.communication_period == 3);
  CHECK(c.strategy.moving_rate == 0.25);
  CHECK(c.strategy.synchronous);
  CHECK(c.strategy.max_staleness == 1);
}

TEST_CASE("config: a saved config with every strategy's keys (an older troupe's) still parses") {
  json old = to_json(parse_job_config(json::parse(R"({"strategy": {"kind": "mirrored"}})")));
  old["strategy"]["shards"] = 1;
  old["strategy"]["communication_period"] = 8;
  old["strategy"]["max_staleness"] = -1;
  CHECK(
      error_of(old.dump()) ==
      R"(strategy.communication_period: the mirrored strategy does not use this key (a key of "elastic_average"))");
  auto c = parse_saved_job_config(old);
  CHECK(c.strategy.kind == "mirrored");
  CHECK_FALSE(to_json(c)["strategy"].contains("shards"));
  // Its own keys are still checked, and unknown keys still refused.
  old["strategy"]["replicas"] = 0;
  CHECK_THROWS_WITH_AS(parse_saved_job_config(old),
                       "strategy.replicas: expected an integer >= 1, got 0", config_error);
  old["strategy"]["replicas"] = 2;
  old["strategy"]["replicaz"] = 2;
  CHECK_THROWS_WITH_AS(parse_saved_job_config(old),
                       R"(strategy.replicaz: unknown key; did you mean "replicas"?)", config_error);
}

TEST_CASE("config: model kinds are the model registries' own, with their family") {
  CHECK(known_model_kinds() ==
        std::vector<std::string>{"layers", "mlp", "policy_value_layers", "policy_value_mlp"});
  CHECK(model_kinds_of(model_family::classifier) == std::vector<std::string>{"layers", "mlp"});
  CHECK(model_kinds_of(model_family::policy_value) ==
        std::vector<std::string>{"policy_value_layers", "policy_value_mlp"});
  register_model_kind("mlp", model_family::classifier);  // again: nothing changes
  CHECK_THROWS_AS(register_model_kind("mlp", model_family::policy_value), std::invalid_argument);
}

TEST_CASE("config: {\"name\":\"x\"} changes only the name") {
  job_config c = parse_job_config(json::parse(R"({"name":"x"})"));
  CHECK(c.name == "x");
  const job_config defaults;
  json expected = to_json(defaults);
  expected["name"] = "x";
  CHECK(to_json(c) == expected);
}

TEST_CASE("config: a full config parses, integral floats count as integers") {
  job_config c = parse_job_config(json::parse(R"({
    "name": "fm-mirrored_2", "seed": 18446744073709551615,
    "model": {"hidden": [512, 128, 64], "activation": "tanh", "init": "glorot"},
    "optimizer": {"kind": "momentum", "learning_rate": 0.1, "momentum": 0, "nesterov": true,
                  "weight_decay": 5e-4, "decoupled_weight_decay": true,
                  "schedule": {"kind": "cosine", "warmup_steps": 100, "decay_steps": 1e4,
                               "min_lr": 0.001}},
    "data": {"batch_size": 256.0, "shuffle": false, "normalize": false, "prefetch": 4,
             "gather": "device", "train_limit": 1000, "test_limit": 500, "path": "/tmp/fm"},
    "strategy": {"kind": "mirrored", "replicas": 4},
    "devices": ["cuda:0", "cuda:1", "cpu:0", "cuda:10"],
    "training": {"epochs": 3, "max_steps": 700, "eval_every_epochs": 0, "steps_per_execution": 16},
    "checkpoint": {"dir": "ck", "every_steps": 100, "keep": 0, "save_at_end": false},
    "logging": {"level": "debug", "every_steps": 10, "output_dir": "out"}
  })"));
  CHECK(c.name == "fm-mirrored_2");
  CHECK(c.seed == 18446744073709551615ull);
  CHECK(c.model.hidden == std::vector<int64_t>{512, 128, 64});
  CHECK(c.optimizer.kind == "momentum");
  CHECK(c.optimizer.momentum == 0.0);
  CHECK(c.optimizer.nesterov);
  CHECK(c.optimizer.schedule.decay_steps == 10000);
  CHECK(c.data.batch_size == 256);
  CHECK(c.data.gather == "device");
  CHECK(c.strategy.replicas == 4);
  CHECK(c.devices.size() == 4);
  CHECK(c.training.steps_per_execution == 16);
  CHECK(c.logging.level == "debug");
  // One device shared by several replicas is fine for the multi-replica strategies.
  CHECK(error_of(R"({"strategy": {"kind": "mirrored", "replicas": 4}, "devices": ["cpu:0"]})")
            .empty());
  // Empty hidden list: a linear model.
  CHECK(parse_job_config(json::parse(R"({"model": {"hidden": []}})")).model.hidden.empty());
}

TEST_CASE("config: to_json round-trips through parse_job_config") {
  job_config c;
  c.name = "rt";
  c.seed = 7;
  c.model.hidden = {3, 5};
  c.model.activation = "tanh";
  c.model.init = "he";
  c.optimizer.kind = "rmsprop";
  c.optimizer.learning_rate = 0.1 / 3;  // not exactly representable in short decimal
  c.optimizer.rho = 0.95;
  c.optimizer.epsilon = 1e-7;
  c.optimizer.weight_decay = 1e-4;
  c.optimizer.schedule.kind = "step";
  c.optimizer.schedule.gamma = 0.5;
  c.optimizer.schedule.step_size = 30;
  c.data.path = "/data/fm";
  c.data.batch_size = 64;
  c.data.shuffle = false;
  c.strategy.kind = "parameter_server";
  c.strategy.replicas = 3;
  c.devices = {"cpu:0", "cpu:1"};
  c.training.max_steps = 5;
  c.training.steps_per_execution = training_config::kAutoSteps;  // "auto": parameter_server takes 1
  c.checkpoint.dir = "ck";
  c.logging.output_dir = "out";
  json j = to_json(c);
  job_config back = parse_job_config(j);
  CHECK(to_json(back) == j);
  CHECK(back.optimizer.learning_rate == c.optimizer.learning_rate);
  CHECK(back.devices == c.devices);
  CHECK(j["training"]["steps_per_execution"] == "auto");
  // Through text too (what summary.json and manifests store).
  CHECK(to_json(parse_job_config(json::parse(j.dump()))) == j);
  // Every key is present, and every section has every field.
  CHECK(j.size() == 10);
  CHECK(j["optimizer"].size() == 11);
  CHECK(j["optimizer"]["schedule"].size() == 6);
  CHECK(j["data"].size() == 12);
  CHECK(j["data"]["placement"] == "auto");
  CHECK(j["training"]["step_graphs"] == "auto");
  const job_config defaults;
  CHECK(to_json(parse_job_config(to_json(defaults))) == to_json(defaults));
}

namespace {

struct temp_file {
  std::filesystem::path path;
  explicit temp_file(const std::string& text) {
    path = std::filesystem::temp_directory_path() /
           ("troupe_test_config_" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << text;
  }
  ~temp_file() { std::filesystem::remove(path); }
};

std::string load_error(const std::string& file) {
  try {
    load_job_config(file);
  } catch (const config_error& e) {
    CHECK(e.path().empty());
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: each data format's keys, read and written back") {
  const char* configs[] = {
      R"({"data": {"format": "npy", "train": {"x": "xa.npy", "y": "ya.npy"},
                   "test": {"x": "xb.npy", "y": "yb.npy"}, "standardize": true, "classes": 3}})",
      R"({"data": {"format": "npz", "train": "a.npz", "test": "b.npz", "x_key": "images"}})",
      R"({"data": {"format": "csv", "train": "a.csv", "test": "b.csv", "label": "species"}})",
      R"({"data": {"format": "idx", "path": "/d"}})",
  };
  for (const char* text : configs) {
    CAPTURE(text);
    job_config c = parse_job_config(json::parse(text));
    json j = to_json(c);
    CHECK(to_json(parse_job_config(j)) == j);
  }
  job_config npy = parse_job_config(json::parse(configs[0]));
  CHECK(npy.data.format == "npy");
  CHECK(npy.data.train.x == "xa.npy");
  CHECK(npy.data.test.y == "yb.npy");
  CHECK(npy.data.standardize);
  CHECK(npy.data.classes == 3);
  CHECK(to_json(npy)["data"]["train"] == json{{"x", "xa.npy"}, {"y", "ya.npy"}});
  CHECK_FALSE(to_json(npy)["data"].contains("path"));
  job_config npz = parse_job_config(json::parse(configs[1]));
  CHECK(npz.data.train.file == "a.npz");
  CHECK(npz.data.x_key == "images");
  CHECK(npz.data.y_key == "y");
  CHECK(to_json(npz)["data"]["x_key"] == "images");
  job_config csv = parse_job_config(json::parse(configs[2]));
  CHECK(csv.data.label == "species");
  CHECK(to_json(csv)["data"]["label"] == "species");
  CHECK_FALSE(to_json(csv)["data"].contains("x_key"));
  CHECK(parse_job_config(json::object()).data.format == "idx");
}

TEST_CASE("config: load_job_config reports syntax errors with line and column") {
  temp_file f("{\n  \"name\": \"x\",\n  \"seed\": ,\n}\n");
  const std::string p = f.path.string();
  CHECK(load_error(p) == p + ": JSON syntax error at line 3, column 11: unexpected ','; expected "
                             "'[', '{', or a literal (while parsing value)");
}

TEST_CASE("config: load_job_config syntax error at the end of the input") {
  temp_file f("{\"name\": \"x\"\n");
  const std::string p = f.path.string();
  CHECK(load_error(p) == p + ": JSON syntax error at line 2, column 1: unexpected end of input; "
                             "expected '}' (while parsing object)");
}

TEST_CASE("config: load_job_config missing file") {
  CHECK(load_error("/nonexistent/x.json") ==
        "cannot open config file '/nonexistent/x.json': No such file or directory");
}

TEST_CASE("config: load_job_config on a good file (comments allowed)") {
  temp_file f("// a job\n{\"name\": \"loaded\", /* inline */ \"seed\": 1}\n");
  job_config c = load_job_config(f.path.string());
  CHECK(c.name == "loaded");
  CHECK(c.seed == 1);
}

TEST_CASE("config: load_job_config passes schema errors through") {
  temp_file f(R"({"optimizer": {"kind": "adamw"}})");
  try {
    load_job_config(f.path.string());
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    CHECK(e.path() == "optimizer.kind");
  }
}

TEST_CASE("config: sizes that allocate are bounded, odd keys and deep values are shown safely") {
  CHECK(error_of(R"({"data": {"prefetch": 1000000}})") ==
        "data.prefetch: expected an integer in [1, 1024], got 1000000");
  CHECK(error_of(R"({"strategy": {"kind": "mirrored", "replicas": 4000000000}})") ==
        "strategy.replicas: expected an integer in [1, 65536], got 4000000000");
  CHECK(error_of(R"({"strategy": {"kind": "actor_learner"}, "rl": {"envs_per_actor": 1e9}})") ==
        "rl.envs_per_actor: expected an integer in [1, 1048576], got 1000000000.0");
  // A key holding a newline or NUL is shown escaped, in one line.
  auto nl = error_of("{\"data\": {\"a\\nb\": 1}}");
  CHECK(nl.starts_with(R"(data.a\nb: unknown key)"));
  CHECK(nl.find('\n') == std::string::npos);
  auto nul = error_of("{\"x\\u0000y\": 1}");
  CHECK(nul.starts_with(R"(x\u0000y: unknown key)"));
  // A value nested 100,000 deep is described, not printed.
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK(error_of(R"({"name": )" + deep + "}") ==
        "name: expected a non-empty name of letters, digits, '.', '_' or '-', got an array of 1 "
        "elements");
}

TEST_CASE("deeply nested configs are refused before parsing, naming the file") {
  for (char open : {'[', '{'}) {
    std::string deep = "{\"name\": " + std::string(200000, open);
    try {
      parse_job_config_text(deep, "deep.json");
      FAIL("accepted");
    } catch (const config_error& e) {
      CHECK(std::string(e.what()).find("deep.json: JSON nested too deeply (more than 64") !=
            std::string::npos);
    }
  }
  // Brackets inside strings and comments do not count.
  std::string quoted = "// [[[[\n{\"name\": \"" + std::string(100, '[') + "\"}";
  std::string msg;
  try {
    parse_job_config_text(quoted, "q.json");
  } catch (const config_error& e) {
    msg = e.what();
  }
  CHECK(msg.find("name") != std::string::npos);
  CHECK(msg.find("nested") == std::string::npos);
}

TEST_CASE("mutated configs and cluster specs: accepted or a config_error, nothing else") {
  const std::string dir = TROUPE_SOURCE_DIR "/examples/";
  for (const char* file : {"fashion_mnist_mirrored.json", "fashion_mnist_mirrored_2proc.json",
                           "cartpole_impala.json"}) {
    std::ifstream in(dir + file, std::ios::binary);
    const std::string valid{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    REQUIRE(fuzz::config_text(valid));
    REQUIRE(fuzz::cluster_text(valid));
    fuzz::mutator mutate(42);
    int accepted = 0;
    for (int i = 0; i < 1500; ++i) {
      const std::string m = mutate(valid);
      CAPTURE(m);
      bool ok = false;
      CHECK_NOTHROW(ok = fuzz::cluster_text(m));
      accepted += ok;
    }
    MESSAGE(std::string(file) << ": " << accepted << " of 1500 mutants accepted");
  }
}

TEST_CASE("config: strategy.replicas \"auto\" takes every core, or every listed device") {
  const int64_t cores = usable_cpu_cores();
  REQUIRE(cores >= 1);
  auto c =
      parse_job_config(json::parse(R"({"strategy": {"kind": "mirrored", "replicas": "auto"}})"));
  CHECK(c.strategy.replicas_auto);
  CHECK(c.strategy.replicas == cores);
  REQUIRE(c.devices.size() == static_cast<std::size_t>(cores));
  for (int64_t i = 0; i < cores; ++i) CHECK(c.devices[i] == "cpu:" + std::to_string(i));

  // Listed devices: one replica each, and the list is kept as given.
  c = parse_job_config(json::parse(
      R"({"strategy": {"kind": "central_storage", "replicas": "auto"}, "devices": ["cpu:0", "cpu:2", "cpu:1"]})"));
  CHECK(c.strategy.replicas == 3);
  CHECK(c.devices == std::vector<std::string>{"cpu:0", "cpu:2", "cpu:1"});

  // one_device: always one; a global batch smaller than the devices caps it.
  CHECK(parse_job_config(json::parse(R"({"strategy": {"replicas": "auto"}})")).strategy.replicas ==
        1);
  c = parse_job_config(json::parse(
      R"({"strategy": {"kind": "mirrored", "replicas": "auto"}, "data": {"batch_size": 2},
          "devices": ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]})"));
  CHECK(c.strategy.replicas == 2);

  // The effective config holds the count that ran, and parses back to it.
  auto again = parse_job_config(to_json(c));
  CHECK(again.strategy.replicas == 2);
  CHECK_FALSE(again.strategy.replicas_auto);

  CHECK(error_of(R"({"strategy": {"kind": "mirrored", "replicas": "all"}})") ==
        R"(strategy.replicas: expected an integer in [1, 65536] or "auto", got "all")");

  // Every process of a cluster must agree on the count: "auto" is refused there.
  std::ifstream in(TROUPE_SOURCE_DIR "/examples/fashion_mnist_mirrored_2proc.json");
  json two = json::parse(in, nullptr, true, /*ignore_comments=*/true);
  two["strategy"]["replicas"] = "auto";
  const auto msg = error_of(two.dump());
  CHECK(msg.find("strategy.replicas: \"auto\" is for a job in one process") == 0);
}
