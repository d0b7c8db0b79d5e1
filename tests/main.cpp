#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tests/skip.hpp"

int main(int argc, char** argv) {
  return troupe::test::run_cases(argc, argv);
}
