# SPDX-License-Identifier: Apache-2.0
# The tests, all run by ctest, by kind (each kind a folder of tests/):
#   abi/      black-box: programs that know only <ecx.h> and libecx.so
#   unit/     white-box cmocka tests on the library's internals
#   shell/    processes: the CLI, peers and hostile programs, driven by shell
#             scripts that share shell/lib.sh
#   fuzz/     the libFuzzer targets (ECX_FUZZ builds; Makefile `fuzz`)
#   support/  what the tests run or link: peers, helpers, the fault backend
# (tests/nixl, tests/vllm, tests/pyref: the Python peers of NIXL, vLLM and the
# reference implementation; tests/vectors: the wire and hash vectors.)
# A test that needs the ucx or nixl path is registered only where it is built.
enable_testing()
pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
set(ECX_VECTORS ${CMAKE_SOURCE_DIR}/tests/vectors)
set(ECX_SHELL ${CMAKE_SOURCE_DIR}/tests/shell)
# What the shell tests' `built PATH` (shell/lib.sh) answers.
set(ECX_PATHS_BUILT auto shm tcp)
if(ECX_WITH_UCX)
  list(APPEND ECX_PATHS_BUILT ucx)
endif()
if(ECX_WITH_NIXL)
  list(APPEND ECX_PATHS_BUILT nixl)
endif()
list(JOIN ECX_PATHS_BUILT " " ECX_PATHS_BUILT)

# ---- abi: the public library as its users see it --------------------------

# The public API as an engine sees it: only <ecx.h>, linked against libecx.so
# so that it can reach only what the library exports.
add_executable(test_api tests/abi/test_api.c tools/bench_ctx.c tools/bench_util.c)
target_include_directories(test_api PRIVATE tools)
target_link_libraries(test_api PRIVATE ecx PkgConfig::CMOCKA)
add_test(NAME test_api COMMAND test_api)
# The build boundary: libecx.so exports exactly ecx.h's ECX_API names, and
# an install works for a program that knows only <ecx.h> and pkg-config.
# Plain builds only: sanitizer-built libraries are not for installing.
if(NOT ECX_SANITIZE AND NOT ECX_TSAN)
  add_test(NAME test_exports COMMAND bash ${CMAKE_SOURCE_DIR}/tests/abi/test_exports.sh
    $<TARGET_FILE:ecx> $<TARGET_FILE:ecx_static> ${CMAKE_SOURCE_DIR}/include/ecx.h)
  # Once the CLI links the shared library, test_install checks the installed one too.
  get_target_property(ECX_CLI_LIBS ecx_cli LINK_LIBRARIES)
  if("ecx" IN_LIST ECX_CLI_LIBS)
    set(ECX_CLI_SHARED 1)
  else()
    set(ECX_CLI_SHARED 0)
  endif()
  add_test(NAME test_install COMMAND bash ${CMAKE_SOURCE_DIR}/tests/abi/test_install.sh
    ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}/tests/abi/install_smoke.c ${CMAKE_C_COMPILER} ${ECX_CLI_SHARED}
    ${CMAKE_SOURCE_DIR})
endif()

# ---- unit: the library's parts, white-box ---------------------------------

function(ecx_unit_test name)
  add_executable(${name} tests/unit/${name}.c ${ARGN})
  target_link_libraries(${name} PRIVATE ecx_internal PkgConfig::CMOCKA PkgConfig::JANSSON)
  target_compile_definitions(${name} PRIVATE ECX_VECTORS="${ECX_VECTORS}")
  add_test(NAME ${name} COMMAND ${name})
endfunction()
ecx_unit_test(test_wire)
ecx_unit_test(test_compat)
ecx_unit_test(test_ctrl)
ecx_unit_test(test_cache)
ecx_unit_test(test_table)
ecx_unit_test(test_conn_budget)
ecx_unit_test(test_sessions)
target_include_directories(test_sessions PRIVATE bench)
ecx_unit_test(test_integration)
target_compile_definitions(test_integration PRIVATE ECX_BIN="$<TARGET_FILE:ecx_cli>")
add_dependencies(test_integration ecx_cli)
ecx_unit_test(test_data)
target_include_directories(test_data PRIVATE bench)
# test_region forks and execs region_helper to act as a second process.
add_executable(region_helper tests/support/region_helper.c)
target_link_libraries(region_helper PRIVATE ecx_internal)
ecx_unit_test(test_region)
target_compile_definitions(test_region PRIVATE REGION_HELPER="$<TARGET_FILE:region_helper>")
add_dependencies(test_region region_helper)
# The same-host copy on its own (plain C: it must own the SIGBUS handler).
add_executable(test_shm_copy tests/unit/test_shm_copy.c)
target_link_libraries(test_shm_copy PRIVATE ecx_internal)
add_test(NAME test_shm_copy COMMAND test_shm_copy)

# ---- shell: processes ------------------------------------------------------

function(ecx_shell_test name)
  add_test(NAME ${name} COMMAND bash ${ECX_SHELL}/${name}.sh ${ARGN})
endfunction()
set(ECX $<TARGET_FILE:ecx_cli>)
# The CLI as a user runs it: every wire vector, compat hashes, bad input.
ecx_shell_test(test_cli ${ECX} ${ECX_VECTORS})
# A new operator's mistakes (issue 23), each with what the operator is told.
ecx_shell_test(test_operator ${ECX})
ecx_shell_test(test_serve_get ${ECX})
ecx_shell_test(test_huge_pages ${ECX})
set_tests_properties(test_huge_pages PROPERTIES SKIP_RETURN_CODE 77)
ecx_shell_test(test_interop ${ECX})
ecx_shell_test(test_integrity ${ECX})
ecx_shell_test(test_curve ${ECX})
ecx_shell_test(test_hostile_local ${ECX})
ecx_shell_test(test_grant_forgery ${ECX})
# Issue 20 item 6: a producer relaying another's genuine acks gets no READ of that one's region.
ecx_shell_test(test_relay ${ECX})
ecx_shell_test(test_fd_limit ${ECX})
# Issue 20: dripping / refused-only tcp data connections from many addresses (~45 s).
ecx_shell_test(test_tcp_drip ${ECX})
set_tests_properties(test_tcp_drip PROPERTIES TIMEOUT 180)
# Issue 20: 1000 idle ZeroMQ connections to `ecx serve` under ulimit -n 1024 (~25 s).
ecx_shell_test(test_ctrl_idle ${ECX})
set_tests_properties(test_ctrl_idle PROPERTIES TIMEOUT 120)
# Issue 20: 200 dripping /metrics connections from 25 addresses; a scraper is served (~15 s).
ecx_shell_test(test_metrics_idle ${ECX})
# 60 s soak (SOAK_SECONDS): consumers, misses, not-ready items, killed peers; bytes and blocks accounted for.
ecx_shell_test(test_soak ${ECX})
set_tests_properties(test_soak PROPERTIES TIMEOUT 200)
# ecx demo, small: passes with its table, fails when a byte is flipped, exits 2 on bad options.
ecx_shell_test(test_demo ${ECX})
set_tests_properties(test_demo PROPERTIES TIMEOUT 600)
# ecx bench ctrl against ecx serve: answers, format, bad input.
ecx_shell_test(test_bench ${ECX})
add_executable(dead_producers tests/support/dead_producers.c)
target_link_libraries(dead_producers PRIVATE ecx_internal)
ecx_shell_test(test_dead_producers ${ECX} $<TARGET_FILE:dead_producers>)
add_executable(flood_consumer tests/support/flood_consumer.c)
target_link_libraries(flood_consumer PRIVATE ecx_internal)
ecx_shell_test(test_ack_flood ${ECX} $<TARGET_FILE:flood_consumer>)
# Hostile same-host producers and consumers, as real processes.
add_executable(shm_hostile tests/support/shm_hostile.c)
target_link_libraries(shm_hostile PRIVATE ecx_internal)
ecx_shell_test(test_shm_hostile $<TARGET_FILE:shm_hostile>)
# Two-process data-plane tests: data_peer is one side of a transfer.
add_executable(data_peer tests/support/data_peer.c)
target_include_directories(data_peer PRIVATE bench)
target_link_libraries(data_peer PRIVATE ecx_internal)
ecx_shell_test(test_data_procs $<TARGET_FILE:data_peer>)
ecx_shell_test(test_data_netns $<TARGET_FILE:data_peer>)
set_tests_properties(test_data_netns PROPERTIES SKIP_RETURN_CODE 77)
# The tcp path against hostile clients and a hostile producer (ucx_hostile's
# tcp part, built with or without UCX); with UCX, the ucx path against hostile
# peers (and a SIGSTOPped producer).
add_executable(ucx_hostile tests/support/ucx_hostile.c)
target_link_libraries(ucx_hostile PRIVATE ecx_internal)
ecx_shell_test(test_tcp_hostile $<TARGET_FILE:ucx_hostile>)
if(ECX_WITH_UCX)
  ecx_shell_test(test_ucx_hostile $<TARGET_FILE:ucx_hostile> ${ECX})
endif()
# A slow reader past its lease while the producer saves over what is unpinned, and
# consumers pinning what they can while the encoder saves (issue 20).
add_executable(events_producer tests/support/events_producer.c)
target_link_libraries(events_producer PRIVATE ecx)
target_include_directories(events_producer PRIVATE include)
ecx_shell_test(test_events $<TARGET_FILE:events_producer> ${ECX} ${CMAKE_SOURCE_DIR})
add_executable(pin_saver tests/support/pin_saver.c)
target_link_libraries(pin_saver PRIVATE ecx_internal)
ecx_shell_test(test_slow_reader $<TARGET_FILE:pin_saver> ${ECX})
ecx_shell_test(test_pin_hogs $<TARGET_FILE:pin_saver> ${ECX})

# ---- the benchmarks, tiny: that they run and print what they should --------
# (tests/shell/test_formats.sh states each line and key they must print;
# behaviour only, never the figures.)

function(ecx_format_test name case)
  add_test(NAME ${name} COMMAND bash ${ECX_SHELL}/test_formats.sh ${case} ${ARGN})
endfunction()
# The data-plane benchmark as its own program.
add_executable(bench_data bench/bench_data.c bench/data_bench.c tools/bench_util.c)
target_include_directories(bench_data PRIVATE bench tools)
target_link_libraries(bench_data PRIVATE ecx_internal)
# The shm copy kernel (and each fsum kernel) against memcpy.
add_executable(bench_copy bench/copy_bench.c tools/bench_util.c)
target_include_directories(bench_copy PRIVATE tools)
target_link_libraries(bench_copy PRIVATE ecx_internal)
ecx_format_test(bench_copy_smoke bench_copy $<TARGET_FILE:bench_copy>)
# Plain TCP between two processes: the baseline of bench/tcp_vs_raw.sh.
add_executable(raw_tcp bench/raw_tcp.c tools/bench_util.c)
target_include_directories(raw_tcp PRIVATE tools)
ecx_format_test(test_tcp_vs_raw tcp_vs_raw ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
ecx_format_test(bench_data_smoke bench_data $<TARGET_FILE:bench_data>)
# Regions go under $ECX_SHM_DIR, as the library's do: a directory that is not there is named.
add_test(NAME bench_data_shm_dir COMMAND bench_data --size 300000 --iters 1 --warmup 0 --path shm)
set_tests_properties(bench_data_shm_dir PROPERTIES
                     ENVIRONMENT "ECX_SHM_DIR=/nonexistent-ecx-bench-shm-dir"
                     PASS_REGULAR_EXPRESSION "cannot make /nonexistent-ecx-bench-shm-dir/ecx-bench-data-")
add_test(NAME bench_data_bad_args COMMAND bench_data --size 28.8M)
set_tests_properties(bench_data_bad_args PROPERTIES PASS_REGULAR_EXPRESSION "usage: bench_data")
# The cache bench.
add_executable(bench_cache bench/bench_cache.c)
target_link_libraries(bench_cache PRIVATE ecx_internal)
add_test(NAME bench_cache_smoke COMMAND bench_cache --small 200 --large 2000 --ops 20000)
set_tests_properties(bench_cache_smoke PROPERTIES PASS_REGULAR_EXPRESSION "ratio=[0-9]")
# Per-call cost of the engine's calls from C: the baseline of the Python
# binding's benchmark (bench/py_overhead.py).
add_executable(call_overhead bench/call_overhead.c)
target_link_libraries(call_overhead PRIVATE ecx)
ecx_format_test(call_overhead_smoke call_overhead $<TARGET_FILE:call_overhead>)
# What a new context costs before its first item is in (bench/startup.c;
# bench/startup_before_after.sh builds it against two builds).
add_executable(startup bench/startup.c)
target_link_libraries(startup PRIVATE ecx)
ecx_format_test(startup_smoke startup $<TARGET_FILE:startup>)
# Control-plane instructions per request: ecx's producer next to a bare
# ZeroMQ echo, under callgrind (bench/ctrl_instr.sh; skipped without valgrind).
add_executable(ctrl_serve bench/ctrl_serve.c)
target_link_libraries(ctrl_serve PRIVATE ecx_static)
add_executable(zmq_echo bench/zmq_echo.c)
target_link_libraries(zmq_echo PRIVATE ecx_static PkgConfig::ZMQ)
# Plain builds only: valgrind cannot run sanitizer-built programs.
if(NOT ECX_SANITIZE AND NOT ECX_TSAN)
  ecx_format_test(test_ctrl_instr ctrl_instr ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(test_ctrl_instr PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
# ecx bench data over every path built in (without UCX: ucx skipped), ecx
# bench stall and its usage errors, and bench/compare.sh in its quick mode.
ecx_format_test(test_bench_data bench_data_cli ${ECX})
ecx_format_test(test_bench_stall bench_stall ${ECX})
ecx_format_test(test_bench_stall_bad_args bench_stall_bad_args ${ECX})
ecx_format_test(test_bench_compare bench_compare ${CMAKE_SOURCE_DIR} ${ECX})

# ---- nixl: against the real nixl package and vLLM (ECX_WITH_NIXL) ----------

if(ECX_WITH_NIXL)
  set(ECX_NIXL_VENV_DIR ${CMAKE_BINARY_DIR} CACHE PATH "where tests/nixl/venv.sh puts nixl-venv")
  # The venv as a CTest fixture: tests that need it say FIXTURES_REQUIRED nixl_venv, so it is
  # built (once; later runs only check its stamp) before them, whatever the test order.
  add_test(NAME nixl_venv COMMAND bash ${CMAKE_SOURCE_DIR}/tests/nixl/venv.sh ${ECX_NIXL_VENV_DIR})
  set_tests_properties(nixl_venv PROPERTIES FIXTURES_SETUP nixl_venv TIMEOUT 1800)
  # NIXL's formats against blobs the real nixl package writes at test time
  # (skipped, exit 77, without a python that has it: tests/nixl/find_python.sh).
  add_executable(test_nixl_format tests/unit/test_nixl_format.c)
  target_link_libraries(test_nixl_format PRIVATE ecx_internal PkgConfig::JANSSON)
  ecx_shell_test(test_nixl_format $<TARGET_FILE:test_nixl_format> ${ECX_NIXL_VENV_DIR})
  # ecx's NIXL peer (Debian's UCX) and a real nixl agent, both directions.
  add_executable(nixl_peer tests/support/nixl_peer.c)
  target_link_libraries(nixl_peer PRIVATE ecx_internal)
  ecx_shell_test(test_nixl_peer $<TARGET_FILE:nixl_peer> ${ECX_NIXL_VENV_DIR})
  # The NIXL agent process killed (SIGKILL, SIGABRT) under `ecx serve --data nixl` and under a
  # nixl consumer: ecx lives, the helper is restarted, later fetches are byte-exact; the
  # restart bound; a missing helper.
  add_executable(nixl_refetch tests/support/nixl_refetch.c)
  target_link_libraries(nixl_refetch PRIVATE ecx PkgConfig::JANSSON)
  add_dependencies(nixl_refetch ecx_nixl_agent)
  ecx_shell_test(test_nixl_agent_proc ${ECX} $<TARGET_FILE:nixl_refetch> $<TARGET_FILE:nixl_peer>
    ${ECX_NIXL_VENV_DIR})
  # The same with every helper on the nixl wheel's UCX (ECX_NIXL_UCX).
  add_test(NAME test_nixl_agent_proc_peer_ucx COMMAND bash ${ECX_SHELL}/test_nixl_agent_proc.sh ${ECX}
    $<TARGET_FILE:nixl_refetch> $<TARGET_FILE:nixl_peer> ${ECX_NIXL_VENV_DIR} peer-ucx)
  set_tests_properties(test_nixl_agent_proc test_nixl_agent_proc_peer_ucx PROPERTIES TIMEOUT 300)
  # `ecx serve --data nixl` with a real nixl agent as its consumer, vLLM's way.
  ecx_shell_test(test_nixl_serve ${ECX} ${ECX_NIXL_VENV_DIR})
  # `ecx get --data nixl` from a real nixl agent serving vLLM's way; mutated acks.
  ecx_shell_test(test_nixl_get ${ECX} ${ECX_NIXL_VENV_DIR})
  # The same two ways with ECX_NIXL_UCX: ecx's NIXL agent on the nixl wheel's own UCX.
  ecx_shell_test(test_nixl_peer_ucx ${ECX} ${ECX_NIXL_VENV_DIR})
  set_tests_properties(test_nixl_format test_nixl_peer test_nixl_agent_proc
    test_nixl_agent_proc_peer_ucx test_nixl_serve test_nixl_get test_nixl_peer_ucx PROPERTIES SKIP_RETURN_CODE 77 FIXTURES_REQUIRED nixl_venv)
  # ecx against vLLM 0.34.0's own ECCPUConnector (sessions, ZeroMQ control, NIXL data) in a
  # pinned venv that tests/nixl/venv.sh builds once under ECX_NIXL_VENV_DIR (the first run
  # installs it: minutes, and PyPI or the local wheels); protocol version 2.
  ecx_shell_test(test_vllm_interop ${ECX} ${ECX_NIXL_VENV_DIR})
  set_tests_properties(test_vllm_interop PROPERTIES TIMEOUT 600 FIXTURES_REQUIRED nixl_venv)
  # tests/nixl/bench_vs_vllm.sh, tiny: vLLM's own NIXL fetch rate (and ecx's where it has the
  # nixl path) printed in its format; behaviour only, never timings.
  ecx_format_test(test_bench_vllm bench_vllm ${CMAKE_SOURCE_DIR} ${ECX} ${ECX_NIXL_VENV_DIR})
  set_tests_properties(test_bench_vllm PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED nixl_venv)
endif()

# Every test knows which data paths this build has (shell/lib.sh: built).
get_property(ECX_TESTS DIRECTORY PROPERTY TESTS)
set_property(TEST ${ECX_TESTS} APPEND PROPERTY ENVIRONMENT "ECX_PATHS_BUILT=${ECX_PATHS_BUILT}")
