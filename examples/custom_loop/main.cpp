// A custom training loop on troupe: the loop, the step and the gradient
// all-reduce are this program's; troupe provides the replicas (one device
// thread each), the reducers, the batches and the kernels.
//
//   custom_loop [--replicas N] [--epochs E] [--min-accuracy A] [--data DIR]
//
// Trains a model it registers itself ("wide_mlp") on Fashion-MNIST, mirrored
// over N replicas (default 2); prints the loss and test accuracy per epoch;
// exits 1 if the final accuracy is below --min-accuracy (default 0.85).
#include <troupe/troupe.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

// The program's own model: one wide hidden layer, built from troupe's dense
// MLP. Registered, a job config could name it too ("model": {"kind": "wide_mlp"}).
std::unique_ptr<troupe::model> make_wide_mlp(const troupe::model_config& c,
                                             const troupe::model_shape& s, uint64_t seed) {
  troupe::model_config wide = c;
  wide.kind = "mlp";
  wide.hidden = {512};
  return troupe::create_model(wide, s, seed);
}

// What each replica keeps between steps: its copy of the model (same seed,
// so the same initial values), its optimizer, its gradient and batch buffers.
struct replica_state {
  std::unique_ptr<troupe::model> net;
  std::unique_ptr<troupe::kernels::optimizer> opt;
  std::vector<troupe::named_tensor> grads;
  troupe::tensor x, y;
};

}  // namespace

int main(int argc, char** argv) {
  int replicas = 2, epochs = 4;
  double min_accuracy = 0.85;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--replicas")
      replicas = std::atoi(argv[i + 1]);
    else if (a == "--epochs")
      epochs = std::atoi(argv[i + 1]);
    else if (a == "--min-accuracy")
      min_accuracy = std::atof(argv[i + 1]);
    else if (a == "--data")
      data_dir = argv[i + 1];
    else {
      std::fprintf(stderr, "custom_loop: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    troupe::register_model("wide_mlp", make_wide_mlp);

    troupe::data_config dc;
    dc.path = data_dir;
    const auto data = troupe::data::load_fashion_mnist(dc);
    const int64_t global_batch = 256;

    auto group = troupe::replica_group::mirrored(replicas);
    troupe::distributed_dataset train(data.train, global_batch, group.num_replicas(), 42);
    const int64_t steps = train.steps_per_epoch();

    troupe::model_config mc;
    mc.kind = "wide_mlp";
    troupe::optimizer_config oc;
    oc.kind = "adam";
    oc.learning_rate = 0.001;
    std::vector<replica_state> state(static_cast<std::size_t>(group.num_replicas()));
    group.run([&](troupe::replica_context& ctx) {
      auto& st = state[static_cast<std::size_t>(ctx.replica_id())];
      st.net = troupe::create_model(mc, {data.train.features(), data.train.classes}, 7);
      st.opt = std::make_unique<troupe::kernels::optimizer>(oc, steps * epochs);
      st.opt->init(st.net->variables());
      st.grads = st.net->make_gradients();
    });

    const auto start = std::chrono::steady_clock::now();
    double accuracy = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      double loss_sum = 0;
      for (int64_t step = 0; step < steps; ++step) {
        const int64_t batch_rows =
            std::min<int64_t>(global_batch, data.train.size() - step * global_batch);
        // The step every replica runs on its own slice of the global batch.
        auto losses = group.run([&](troupe::replica_context& ctx) {
          auto& st = state[static_cast<std::size_t>(ctx.replica_id())];
          train.batch(epoch, step, ctx.replica_id(), st.x, st.y);
          // Gradients scaled by 1/global batch, summed over the replicas:
          // the mean gradient of the whole batch, the same on every replica.
          const auto stats =
              st.net->train_batch(st.x, st.y, 1.0f / static_cast<float>(batch_rows), st.grads);
          ctx.all_reduce(st.grads, troupe::reduce_op::sum);
          st.opt->apply(st.net->variables(), st.grads);
          return stats.loss_sum;
        });
        loss_sum += troupe::replica_group::reduce(troupe::reduce_op::sum, losses);
      }
      // Every replica holds the same variables: evaluate replica 0's.
      const auto eval = state[0].net->evaluate(data.test.images, data.test.labels);
      accuracy = static_cast<double>(eval.correct) / static_cast<double>(eval.count);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("epoch %d  loss %.4f  test accuracy %.4f  (%.1f s, %d replicas)\n", epoch + 1,
                  loss_sum / static_cast<double>(data.train.size()), accuracy, secs,
                  group.num_replicas());
      std::fflush(stdout);
    }
    if (accuracy < min_accuracy) {
      std::fprintf(stderr, "custom_loop: test accuracy %.4f is below %.4f\n", accuracy,
                   min_accuracy);
      return 1;
    }
    std::printf("custom_loop: final test accuracy %.4f (>= %.2f)\n", accuracy, min_accuracy);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_loop: %s\n", e.what());
    return 1;
  }
}
