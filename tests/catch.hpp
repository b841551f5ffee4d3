// Catch2 v2 (Debian 12) and v3 (newer distributions) behind one include.
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define FLASHGEN_CATCH3 1
#else
#include <catch2/catch.hpp>
#endif
