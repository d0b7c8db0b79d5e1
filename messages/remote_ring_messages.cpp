// CAF 0.17 registers std::vector<T> with every message type T; its loader for
// a vector of enums (std::vector<reduce_op>) trips a false
// -Wmaybe-uninitialized inside CAF's headers (data_processor::fill_range).
// This file holds nothing but the registrations, so the warning is off here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "messages/remote_ring_messages.hpp"

#include <caf/binary_deserializer.hpp>

#include <functional>
#include <map>
#include <mutex>

namespace troupe {

namespace {

struct landing_key {
  const caf::actor_system* sys;
  uint64_t id;
  bool operator<(const landing_key& o) const noexcept {
    return sys != o.sys ? std::less<const caf::actor_system*>{}(sys, o.sys) : id < o.id;
  }
};

std::mutex landings_mx;
std::map<landing_key, std::shared_ptr<ring_landing>> landings;

std::shared_ptr<ring_landing> find_landing(const caf::actor_system& sys, uint64_t id) {
  std::lock_guard<std::mutex> guard{landings_mx};
  auto i = landings.find({&sys, id});
  return i == landings.end() ? nullptr : i->second;
}

}  // namespace

ring_landing::~ring_landing() = default;

void set_ring_landing(const caf::actor_system& sys, uint64_t id, std::shared_ptr<ring_landing> l) {
  std::lock_guard<std::mutex> guard{landings_mx};
  if (l)
    landings[{&sys, id}] = std::move(l);
  else
    landings.erase({&sys, id});
}

caf::error inspect(caf::serializer& f, ring_chunk& x) {
  size_t n = static_cast<size_t>(x.pieces_numel()) * sizeof(float);
  return caf::error::eval(
      [&] { return f(x.seq, x.step, x.offset, x.total, x.op, x.dest); },
      [&] { return f.begin_sequence(n); },
      [&]() -> caf::error {
        for (auto& p : x.pieces)
          if (p.len > 0)
            if (auto err = f.apply_raw(static_cast<size_t>(p.len) * sizeof(float),
                                       const_cast<float*>(p.data)))
              return err;
        return caf::none;
      },
      [&] { return f.end_sequence(); });
}

caf::error inspect(caf::deserializer& f, ring_chunk& x) {
  size_t n = 0;
  return caf::error::eval(
      [&] { return f(x.seq, x.step, x.offset, x.total, x.op, x.dest); },
      [&] { return f.begin_sequence(n); },
      [&]() -> caf::error {
        x.pieces.clear();
        x.keep.clear();
        x.landed = 0;
        if (n % sizeof(float) != 0 || x.total < 0 ||
            n / sizeof(float) > static_cast<uint64_t>(x.total))
          return caf::make_error(caf::sec::invalid_argument,
                                 "ring_chunk: " + std::to_string(n) + " data bytes for " +
                                     std::to_string(x.total) + " elements");
        if (n == 0) return caf::none;
        if (auto* bd = dynamic_cast<caf::binary_deserializer*>(&f); bd && n > bd->remaining())
          return caf::make_error(caf::sec::invalid_argument,
                                 "ring_chunk: " + std::to_string(n) + " data bytes announced, " +
                                     std::to_string(bd->remaining()) + " in the message");
        auto len = static_cast<int64_t>(n / sizeof(float));
        // Straight into the receiver's buffer if it can take it.
        if (x.dest != 0 && f.context() != nullptr)
          if (auto l = find_landing(f.context()->system(), x.dest)) {
            caf::error err;
            if (l->land(x, len, f, err)) {
              if (!err) x.landed = len;
              return err;
            }
          }
        // Every byte is overwritten at once: no zero-fill.
        auto t = tensor::uninitialized(shape_t{len});
        if (auto err = f.apply_raw(n, t.raw())) return err;
        x.pieces.push_back({t.f32(), len});
        x.keep.push_back(std::move(t));
        return caf::none;
      },
      [&] { return f.end_sequence(); });
}

void register_remote_ring_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<reduce_op>("troupe::reduce_op");
  cfg.add_message_type<ring_chunk>("troupe::ring_chunk");
  cfg.add_message_type<ring_peer_actor>("troupe::ring_peer_actor");
  cfg.add_message_type<ring_node_actor>("troupe::ring_node_actor");
}

}  // namespace troupe
