// The Catch2 test runner of the percolite core.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
