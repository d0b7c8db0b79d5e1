#pragma once
// resident_steps: training steps on a data set that lives on the device
// (data.placement "device"), run as executions of several steps with no
// host synchronisation in between, each step a graph captured once per
// shape and replayed (training.step_graphs) where the device has graphs.
//
// One step, every launch of it reading what changes from step to step from
// device memory, so that a captured step replays as any later step:
//
//   gather its rows by the plan -> forward, loss, backward -> optimizer
//   update -> record its loss sum and correct count, counter[0] += 1
//
//   counter  int64[2]: the optimizer's step, the step the execution began at
//   plan     int64: per step of the execution, where its row indices begin
//            in plan; then the indices (backend::gather_planned_rows)
//   table    float[3 a step]: each update's scalars (optimizer::schedule_table)
//   stats    per step of the execution: loss sum (double), correct (int64)
//
// The host writes plan and counter before an execution and reads the stats
// after it: one upload and one download an execution, not a step. The first
// step of each shape (rows, loss scale) runs as it is, which warms what the
// libraries and the model's buffers do once per shape; the second is
// captured and launched, every later one replays that graph. A step that
// cannot be captured runs as it is, and `note` says why, once. Graphs are
// dropped (and captured again) when the device allocated anything between
// two steps: a buffer a graph holds may have been replaced.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"

namespace troupe {

class resident_steps {
 public:
  struct options {
    bool graphs = true;                            // training.step_graphs "auto"
    std::function<void(const std::string&)> note;  // log lines (may be empty)
  };
  struct step {
    const tensor* rows = nullptr;  // int64 [b]: the rows' indices in the attached set
    int64_t global_size = 0;       // examples in the update (the loss is their mean)
  };
  struct counts {
    std::size_t graphs = 0;      // captured shapes
    std::size_t operations = 0;  // operations in the last graph captured
    int64_t replays = 0;         // steps that launched a graph
    int64_t uncaptured = 0;      // steps that ran as they are
  };

  // `net` has a data set of `set_size` rows attached; slots[k][i]: slot k
  // of variable i on the device (compute_state::device_slots).
  resident_steps(model& net, int64_t set_size, kernels::optimizer& opt,
                 std::shared_ptr<device_context> dev, std::vector<std::vector<float*>> slots,
                 options o);

  // Runs the steps in order; their loss sums and correct counts, read back
  // once at the end. Throws std::out_of_range for a row outside the set
  // (before anything runs) and device_error for a device's failure.
  std::vector<batch_stats> run(const std::vector<step>& steps);
  // Before training: a step of `rows` rows (of `global_size` in the
  // update) run once and captured, the model's variables, buffers and the
  // optimizer's slots put back after, so that what the libraries do on
  // first use (module loading, GEMM heuristics, workspaces) is done here
  // and the first step replays the graph. The slots are restored from the
  // optimizer's host copies (current before training).
  // Returns where its time went (milliseconds), for the replica's log.
  struct warm_up_times {
    double step = 0, capture = 0, restore = 0;
  };
  warm_up_times warm_up(int64_t rows, int64_t global_size);
  counts statistics() const { return counts_; }
  bool captures() const { return capture_; }

 private:
  struct shape_graph {
    int seen = 0;
    bool failed = false;
    std::unique_ptr<device_graph> graph;
  };
  void begin_execution(const std::vector<step>& steps);
  void write_plan(const std::vector<step>& steps);
  void ensure_table(int64_t steps);
  void run_step(int64_t rows, float scale);
  void step_as_needed(int64_t rows, float scale);
  void capture_step(shape_graph& g, int64_t rows, float scale);
  void body(int64_t rows, float scale);
  void update();
  void zero_sums();
  // Buffers whose addresses a graph holds: replacing one drops the graphs.
  void grow(device_buffer& b, std::size_t bytes);
  void say(const std::string& line) const {
    if (opts_.note) opts_.note(line);
  }

  model& net_;
  kernels::optimizer& opt_;
  std::shared_ptr<device_context> dev_;
  std::vector<std::vector<float*>> slots_;
  options opts_;
  bool scheduled_ = false;  // the optimizer reads its step on the device
  bool capture_ = false;
  int64_t set_size_ = 0;
  device_buffer counter_, plan_, table_, loss_out_, correct_out_;
  int64_t table_steps_ = 0;
  uint64_t requests_seen_ = 0;  // the device allocator's, after the last step
  std::vector<int64_t> host_plan_;
  std::map<std::pair<int64_t, float>, shape_graph> graphs_;
  counts counts_;
};

}  // namespace troupe
