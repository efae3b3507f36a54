# One fuzz test: copies the seed corpus into WORKDIR/corpus (the working corpus, which libFuzzer
# grows; the repository's seeds are never written) and runs FUZZER on it for SECONDS. Any crash,
# sanitizer report, leak, timeout or out-of-memory fails the test; the input is kept in
# WORKDIR/artifacts/ and its path printed.
# DICT, when given, is a libFuzzer dictionary of the target's tokens.
#   cmake -DFUZZER=... -DSEEDS=... -DWORKDIR=... -DSECONDS=... [-DDICT=...] -P run_fuzzer.cmake
foreach(var FUZZER SEEDS WORKDIR SECONDS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}= is missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORKDIR}/artifacts)
file(MAKE_DIRECTORY ${WORKDIR}/corpus ${WORKDIR}/artifacts)
file(GLOB seeds ${SEEDS}/*)
if(seeds)
  file(COPY ${seeds} DESTINATION ${WORKDIR}/corpus)
endif()
set(dict_flag "")
if(DICT)
  set(dict_flag -dict=${DICT})
endif()
execute_process(
  COMMAND ${FUZZER} ${dict_flag} -max_total_time=${SECONDS} -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix=${WORKDIR}/artifacts/ ${WORKDIR}/corpus
  WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB found ${WORKDIR}/artifacts/*)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); inputs it kept: ${found}\n"
                      "reproduce with: ${FUZZER} <input>")
endif()
