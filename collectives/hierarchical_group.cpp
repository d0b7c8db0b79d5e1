// A group in the process, one across processes, back
// (collectives/hierarchical_group.hpp).
#include "collectives/hierarchical_group.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "devices/device.hpp"

namespace troupe {
namespace {

struct issued_buffer {
  float* data = nullptr;
  std::size_t n = 0;
  reduce_op op = reduce_op::sum;
};

class hierarchical_process_group final : public process_group {
 public:
  hierarchical_process_group(std::unique_ptr<process_group> local,
                             std::shared_ptr<process_group> across, hierarchical_options o)
      : local_(std::move(local)), across_(std::move(across)), opts_(o) {}

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  memory_kind memory() const override { return local_->memory(); }

  void all_reduce(float* data, std::size_t n, reduce_op op) override {
    issue_all_reduce(data, n, op);
    complete();
  }
  void reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    all_reduce(data, chunk * static_cast<std::size_t>(size()), op);
  }
  void all_gather(float* data, std::size_t chunk) override {
    for (int r = 0; r < size(); ++r)
      broadcast(data + static_cast<std::size_t>(r) * chunk, chunk, r);
  }
  void all_reduce_spans(const std::vector<float_span>& spans, reduce_op op) override {
    for (const auto& s : spans) issue_all_reduce(s.data, s.size, op);
    complete();
  }
  // Summed in the process now; across processes and back at complete().
  work issue_all_reduce(float* data, std::size_t n, reduce_op op) override {
    if (op != reduce_op::sum && op != reduce_op::mean)
      throw device_error(std::string("hierarchical all_reduce (") + reduce_op_name(op) +
                         "): reduces by sum or mean only");
    local_->issue_all_reduce(data, n, reduce_op::sum);
    pending_.push_back({data, n, op});
    return issued();
  }

  // Every replica runs every stage whatever failed before it, so that a
  // failure anywhere fails this collective on every replica of every
  // process, and none is left waiting: the process's first replica carries
  // a status (1: failed here) around the processes with the sums, and a
  // replica that learns of a failure aborts its process's group, which
  // frees the others' broadcast.
  void complete() override {
    auto buffers = std::exchange(pending_, {});
    std::string failure = complete_local();
    if (buffers.empty()) {
      if (!failure.empty()) throw device_error(failure);
      return;
    }
    if (across_) failure = take_around(buffers, std::move(failure));
    if (!failure.empty()) {
      local_->abort(failure);
      throw device_error(failure);
    }
    for (const auto& b : buffers) local_->issue_broadcast(b.data, b.n, 0);
    local_->complete();
  }
  void check() override {
    local_->check();
    if (across_) across_->check();
  }
  void abort(const std::string& why) override {
    local_->abort(why);
    if (across_) across_->abort(why);
  }
  void stop_waiting(const std::string& why) override {
    local_->stop_waiting(why);
    if (across_) across_->stop_waiting(why);
  }

 private:
  // The wait in the process; what failed, or "".
  std::string complete_local() {
    try {
      local_->complete();
      return {};
    } catch (const device_error& e) {
      return std::string("hierarchical all-reduce: in this process: ") + e.what();
    }
  }

  // The process's sums around the processes, as one collective (the mean's
  // scale applied once, to the job's sum), with the status last. Returns
  // `failure`, or what failed elsewhere.
  std::string take_around(const std::vector<issued_buffer>& buffers, std::string failure) {
    std::vector<float_span> spans;
    std::vector<std::vector<float>> host;  // moved when it grows: the floats stay put
    for (const auto& b : buffers) {
      if (failure.empty() && opts_.staging == nullptr) {
        spans.push_back({b.data, b.n});
        continue;
      }
      // Staged to the host; or zeros for the sums this process lacks.
      host.emplace_back(b.n, 0.0f);
      if (failure.empty())
        opts_.staging->copy_to_host(host.back().data(), b.data, b.n * sizeof(float));
      spans.push_back({host.back().data(), b.n});
    }
    float status = failure.empty() ? 0.0f : 1.0f;
    spans.push_back({&status, 1});
    try {
      across_->all_reduce_spans(spans, reduce_op::sum);
    } catch (const device_error& e) {
      return failure.empty() ? std::string("hierarchical all-reduce: across processes: ") + e.what()
                             : failure;
    }
    if (!failure.empty()) return failure;
    if (status != 0.0f) return "hierarchical all-reduce: a replica in another process failed";
    finish_sums(buffers, spans);
    return {};
  }

  // The mean's scale, and the sums back to a discrete device.
  void finish_sums(const std::vector<issued_buffer>& buffers,
                   const std::vector<float_span>& spans) {
    const float scale = 1.0f / static_cast<float>(size());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].op == reduce_op::mean)
        std::for_each(spans[i].data, spans[i].data + spans[i].size, [&](float& x) { x *= scale; });
      if (opts_.staging != nullptr)
        opts_.staging->copy_to_device(buffers[i].data, spans[i].data, buffers[i].n * sizeof(float));
    }
  }

  std::unique_ptr<process_group> local_;
  std::shared_ptr<process_group> across_;
  hierarchical_options opts_;
  std::vector<issued_buffer> pending_;  // all-reduces issued since the last complete()
};

}  // namespace

std::unique_ptr<process_group> make_hierarchical_group(std::unique_ptr<process_group> local,
                                                       std::shared_ptr<process_group> across,
                                                       hierarchical_options opts) {
  if (!local)
    throw device_error("hierarchical group: rank " + std::to_string(opts.rank) +
                       " has no group in its process");
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
    throw device_error("hierarchical group: rank " + std::to_string(opts.rank) + " of a group of " +
                       std::to_string(opts.size));
  if ((local->rank() == 0) != static_cast<bool>(across))
    throw device_error("hierarchical group: rank " + std::to_string(opts.rank) +
                       (across ? " is not its process's first replica but was given the group "
                                 "across processes"
                               : " is its process's first replica but has no group across "
                                 "processes"));
  return std::make_unique<hierarchical_process_group>(std::move(local), std::move(across), opts);
}

}  // namespace troupe
