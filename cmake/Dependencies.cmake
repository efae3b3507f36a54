# ddl's third-party libraries: each is looked up first (the system, a module, a conda env or any
# prefix on CMAKE_PREFIX_PATH); one that is missing is built from a pinned copy (FetchContent, the
# download checked against its hash) unless DDL_FETCH_MISSING is OFF, or stops the configure with
# what to load. When everything is found, nothing is downloaded: the build never needs a network
# (FETCHCONTENT_FULLY_DISCONNECTED=ON makes sure of it).
#
# The pinned copies are the upstream sources Debian 12 ships (its .orig tarballs, whose SHA256 come
# from Debian's signed Sources index), except Gloo, whose Debian source is no longer served: Gloo is
# pinned by its git hash to the upstream commit 8 commits after Debian's (5b14351, May 2022), the
# first that builds against Linux 6 headers (its ethtool struct order), which Debian patches instead.
include(FetchContent)

option(DDL_FETCH_MISSING "Build a pinned copy of a missing third-party library (CLI11, fmt, nlohmann_json, Gloo, doctest)" ON)

set(DDL_DEBIAN_POOL "https://deb.debian.org/debian/pool/main" CACHE STRING "Where the pinned .orig tarballs are downloaded from")

# ddl_find_or_fetch(PACKAGE TARGET URL SHA256 [CMAKE_ARGS NAME=VALUE...]): PACKAGE found, or built
# from URL (a tarball checked against SHA256, or git:REPO@COMMIT) so that TARGET exists.
function(ddl_find_or_fetch package target source hash)
  cmake_parse_arguments(PARSE_ARGV 4 arg "" "" "CMAKE_ARGS")
  find_package(${package} QUIET)
  if(${package}_FOUND OR TARGET ${target})
    message(STATUS "ddl: ${package} found (${${package}_DIR})")
    return()
  endif()
  if(NOT DDL_FETCH_MISSING)
    message(FATAL_ERROR "ddl: ${package} was not found and DDL_FETCH_MISSING is OFF: load its module, add its prefix to "
                        "CMAKE_PREFIX_PATH (a conda env: -DCMAKE_PREFIX_PATH=$CONDA_PREFIX), or set DDL_FETCH_MISSING=ON")
  endif()
  foreach(setting IN LISTS arg_CMAKE_ARGS)
    string(REPLACE "=" ";" pair "${setting}")
    list(GET pair 0 name)
    list(GET pair 1 value)
    set(${name} ${value} CACHE INTERNAL "set by ddl for the pinned ${package}")
  endforeach()
  string(TOLOWER ${package} dep)
  if(source MATCHES "^git:(.*)@(.*)$")
    message(STATUS "ddl: ${package} not found: building the pinned ${CMAKE_MATCH_1} at ${CMAKE_MATCH_2}")
    FetchContent_Declare(${dep} GIT_REPOSITORY ${CMAKE_MATCH_1} GIT_TAG ${CMAKE_MATCH_2})
  else()
    message(STATUS "ddl: ${package} not found: building the pinned ${source}")
    FetchContent_Declare(${dep} URL ${source} URL_HASH SHA256=${hash} DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
  endif()
  FetchContent_MakeAvailable(${dep})
  if(NOT TARGET ${target})
    message(FATAL_ERROR "ddl: the pinned ${package} did not define ${target}")
  endif()
endfunction()

ddl_find_or_fetch(fmt fmt::fmt "${DDL_DEBIAN_POOL}/f/fmtlib/fmtlib_9.1.0%2bds1.orig.tar.gz"
                  84ce1c2d0be3a9863935137969dcec6970125caac032f82474640bfc81463583
                  CMAKE_ARGS FMT_DOC=OFF FMT_TEST=OFF FMT_INSTALL=OFF)
if(NOT fmt_FOUND AND TARGET fmt)
  set_target_properties(fmt PROPERTIES POSITION_INDEPENDENT_CODE ON)  # linked into libddl
endif()
ddl_find_or_fetch(CLI11 CLI11::CLI11 "${DDL_DEBIAN_POOL}/c/cli11/cli11_2.1.2%2bds.orig.tar.xz"
                  8143d20b688e98ccce8e24562d3b68e5f47c12e896c42c7ca8553dbde5bed55d
                  CMAKE_ARGS CLI11_BUILD_TESTS=OFF CLI11_BUILD_EXAMPLES=OFF CLI11_BUILD_DOCS=OFF CLI11_INSTALL=OFF)
ddl_find_or_fetch(nlohmann_json nlohmann_json::nlohmann_json
                  "${DDL_DEBIAN_POOL}/n/nlohmann-json3/nlohmann-json3_3.11.2.orig.tar.gz"
                  d69f9deb6a75e2580465c6c4c5111b89c4dc2fa94e3a85fcd2ffcd9a143d9273
                  CMAKE_ARGS JSON_BuildTests=OFF JSON_Install=OFF)
ddl_find_or_fetch(Gloo gloo "git:https://github.com/facebookincubator/gloo.git@10909297fedab0a680799211a299203e53515032" ""
                  CMAKE_ARGS BUILD_TEST=OFF BUILD_BENCHMARK=OFF USE_REDIS=OFF USE_IBVERBS=OFF USE_NCCL=OFF USE_RCCL=OFF
                  USE_LIBUV=OFF)
if(NOT Gloo_FOUND AND TARGET gloo)
  # Gloo's own build gives its headers to its own directory only.
  FetchContent_GetProperties(gloo SOURCE_DIR gloo_source BINARY_DIR gloo_binary)
  target_include_directories(gloo INTERFACE $<BUILD_INTERFACE:${gloo_source}> $<BUILD_INTERFACE:${gloo_binary}>)
  set_target_properties(gloo PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()

if(BUILD_TESTING)
  ddl_find_or_fetch(doctest doctest::doctest "${DDL_DEBIAN_POOL}/d/doctest/doctest_2.4.9%7eds.orig.tar.xz"
                    7cc78169975bea36e70ab9d67e7de9b03d89b38653499ad03243e3944429b1ab
                    CMAKE_ARGS DOCTEST_WITH_TESTS=OFF DOCTEST_WITH_MAIN_IN_STATIC_LIB=OFF DOCTEST_NO_INSTALL=ON)
endif()

find_package(Boost 1.74 QUIET COMPONENTS filesystem)  # Boost.Process runs the scheduler's tools
if(NOT Boost_FOUND)
  message(FATAL_ERROR "ddl: Boost >= 1.74 with Boost.Filesystem was not found (ddl runs srun, sbatch, qsub... "
                      "through Boost.Process): `module load boost`, `conda install -c conda-forge boost-cpp` and "
                      "-DCMAKE_PREFIX_PATH=$CONDA_PREFIX, or -DBoost_ROOT=DIR; on Debian, apt-get install libboost-dev "
                      "libboost-filesystem-dev")
endif()
