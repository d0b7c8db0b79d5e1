#include "messages/messages.hpp"

#include <caf/binary_deserializer.hpp>

#include "messages/node_messages.hpp"
#include "messages/protocols.hpp"
#include "messages/remote_ring_messages.hpp"
#include "messages/rl_messages.hpp"

namespace troupe {

caf::error inspect(caf::serializer& f, tensor& x) {
  auto t = static_cast<uint8_t>(x.type());
  shape_t shape = x.shape();
  size_t n = x.nbytes();
  return caf::error::eval([&] { return f(t, shape); }, [&] { return f.begin_sequence(n); },
                          [&] { return n ? f.apply_raw(n, x.raw()) : caf::none; },
                          [&] { return f.end_sequence(); });
}

caf::error inspect(caf::deserializer& f, tensor& x) {
  uint8_t t = 0;
  shape_t shape;
  size_t n = 0;
  return caf::error::eval(
      [&] { return f(t, shape); }, [&] { return f.begin_sequence(n); },
      [&]() -> caf::error {
        if (t > static_cast<uint8_t>(dtype::i64))
          return caf::make_error(caf::sec::invalid_argument, "tensor: unknown dtype code");
        if (shape.empty() && n == 0) {  // a default-constructed tensor (no shape, no data)
          x = tensor{};
          return caf::none;
        }
        // Checked before allocating: a peer's message must not make this
        // process allocate what its data does not hold.
        uint64_t bytes = dtype_size(static_cast<dtype>(t));
        for (auto d : shape) {
          if (d < 0) return caf::make_error(caf::sec::invalid_argument, "tensor: negative dim");
          auto ud = static_cast<uint64_t>(d);
          if (ud != 0 && bytes > (uint64_t{1} << 62) / ud)
            return caf::make_error(caf::sec::invalid_argument,
                                   "tensor: shape " + shape_string(shape) + " is too large");
          bytes *= ud;
        }
        if (bytes != n)
          return caf::make_error(caf::sec::invalid_argument,
                                 "tensor: shape " + shape_string(shape) + " does not match " +
                                     std::to_string(n) + " data bytes");
        // Nor allocate what the message itself does not carry.
        if (auto* bd = dynamic_cast<caf::binary_deserializer*>(&f); bd && n > bd->remaining())
          return caf::make_error(caf::sec::invalid_argument,
                                 "tensor: " + std::to_string(n) + " data bytes announced, " +
                                     std::to_string(bd->remaining()) + " in the message");
        x.reset(shape, static_cast<dtype>(t));
        return n ? f.apply_raw(n, x.raw()) : caf::none;
      },
      [&] { return f.end_sequence(); });
}

const char* reduce_op_name(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::mean:
      return "mean";
    case reduce_op::min:
      return "min";
    case reduce_op::max:
      return "max";
  }
  return "unknown";
}

reduce_op parse_reduce_op(const std::string& s) {
  for (auto op : {reduce_op::sum, reduce_op::mean, reduce_op::min, reduce_op::max})
    if (s == reduce_op_name(op)) return op;
  throw std::invalid_argument("unknown reduce op '" + s + "' (known: sum, mean, min, max)");
}

std::string describe(const caf::error& e) {
  if (!e) return "no error";
  const auto& ctx = e.context();
  if (ctx.match_elements<std::string>()) return ctx.get_as<std::string>(0);
  return to_string(e);
}

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<tensor>("troupe::tensor");
  cfg.add_message_type<named_tensor>("troupe::named_tensor");
  cfg.add_message_type<std::vector<named_tensor>>("std::vector<troupe::named_tensor>");
  cfg.add_message_type<batch>("troupe::batch");
  cfg.add_message_type<step_stats>("troupe::step_stats");
  cfg.add_message_type<std::vector<step_stats>>("std::vector<troupe::step_stats>");
  cfg.add_message_type<metric_sums>("troupe::metric_sums");
  cfg.add_message_type<model_state>("troupe::model_state");
  cfg.add_message_type<input_pipeline_actor>("troupe::input_pipeline_actor");
  cfg.add_message_type<replica_actor>("troupe::replica_actor");
  // reduce_op is not registered on its own: CAF would register
  // std::vector<reduce_op> with it, whose loader trips -Wmaybe-uninitialized
  // in CAF's headers; reducers only talk inside one process.
  cfg.add_message_type<reducer_stats>("troupe::reducer_stats");
  cfg.add_message_type<reduce_peer_msg>("troupe::reduce_peer_msg");
  cfg.add_message_type<reducer_actor>("troupe::reducer_actor");
  cfg.add_message_type<shard_values>("troupe::shard_values");
  cfg.add_message_type<shard_state>("troupe::shard_state");
  cfg.add_message_type<shard_stats>("troupe::shard_stats");
  cfg.add_message_type<variable_shard_actor>("troupe::variable_shard_actor");
  register_rl_messages(cfg);           // actor/learner RL: unrolls, the trajectory queue
  register_remote_ring_messages(cfg);  // reduce_op, ring_chunk, ring node handles
  register_node_messages(cfg);         // troupe node: joining and wiring processes
}

}  // namespace troupe
