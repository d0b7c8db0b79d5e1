// Child process of test_remote_ring: rank 1 of a 2-process ring.
//   remote_ring_peer PORT0 MODE [CHUNK_BYTES WINDOW]
// Publishes its node on a free port and prints "PORT <p>", joins the ring
// with rank 0 at 127.0.0.1:PORT0, then
//   check: runs ring_test::script(), printing "HASH <i> <hash>" per collective;
//   hang:  runs one collective, prints "READY" and never joins the next one.
// Prints "DONE" and exits when stdin closes or reads "QUIT".
#include <cstdio>
#include <iostream>
#include <string>

#include "actors/net_system_config.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "tests/remote_ring_data.hpp"

int main(int argc, char** argv) {
  using namespace troupe;
  if (argc < 3) {
    std::cerr << "usage: remote_ring_peer PORT0 check|hang [CHUNK_BYTES WINDOW]\n";
    return 2;
  }
  auto port0 = static_cast<uint16_t>(std::stoi(argv[1]));
  std::string mode = argv[2];
  ring_options opt;
  if (argc >= 5) {
    opt.chunk_bytes = std::stoll(argv[3]);
    opt.window = std::stoi(argv[4]);
  }
  net_system_config cfg;
  caf::actor_system sys{cfg};
  auto node = spawn_ring_node(sys, opt);
  auto port = publish_ring_node(sys, node, 0);
  if (!port) {
    std::cerr << "publish: " << sys.render(port.error()) << "\n";
    return 1;
  }
  std::cout << "PORT " << *port << std::endl;
  if (auto err = join_ring(sys, node, 1, {{"127.0.0.1", port0}, {"127.0.0.1", *port}})) {
    std::cerr << "join: " << describe(err) << "\n";
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    return 1;
  }
  int rc = 0;
  if (mode == "check") {
    auto s = ring_test::script();
    for (std::size_t i = 0; i < s.size(); ++i) {
      auto r = ring_allreduce(sys, node, s[i].second,
                              ring_test::inputs(1, static_cast<int>(i), s[i].first));
      if (!r) {
        std::cout << "ERROR " << i << " " << describe(r.error()) << std::endl;
        rc = 1;
        break;
      }
      std::cout << "HASH " << i << " " << ring_test::hash(*r) << std::endl;
    }
  } else {
    auto r = ring_allreduce(sys, node, reduce_op::sum, ring_test::inputs(1, 0, 1000));
    std::cout << (r ? "READY" : "ERROR " + describe(r.error())) << std::endl;
    // "second": then waits in a second collective and says how it ended.
    if (r && mode == "second") {
      auto again = ring_allreduce(sys, node, reduce_op::sum, ring_test::inputs(1, 1, 1000));
      std::cout << (again ? "HASH" : "ERROR " + describe(again.error())) << std::endl;
    }
  }
  std::string line;
  while (std::getline(std::cin, line) && line != "QUIT") {
  }
  std::cout << "DONE" << std::endl;
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  return rc;
}
