# SPDX-License-Identifier: Apache-2.0
# The helper programs libecx starts to run UCX out of the engine's process
# (built with ECX_WITH_UCX): each a program of its own, found by the library
# next to itself (build tree, Python package) or in LIBEXECDIR/ecx. They link
# the library's internals and their path's in-process UCX code, no test code.
#   ecx-ucx-agent   the ucx data path's UCX (src/data/ucx/ucx_proc.h)
#   ecx-nixl-agent  the NIXL agent of the nixl data path (src/data/nixl/nixl_proc.h)
add_executable(ecx_ucx_agent ${CMAKE_CURRENT_LIST_DIR}/ucx_agent_main.c)
set_target_properties(ecx_ucx_agent PROPERTIES OUTPUT_NAME ecx-ucx-agent)
target_link_libraries(ecx_ucx_agent PRIVATE ecx_ucx_inproc)
set(ECX_AGENTS ecx_ucx_agent)
if(ECX_WITH_NIXL)
  add_executable(ecx_nixl_agent ${CMAKE_CURRENT_LIST_DIR}/nixl_agent_main.c ${CMAKE_CURRENT_LIST_DIR}/peer_ucx.c)
  set_target_properties(ecx_nixl_agent PROPERTIES OUTPUT_NAME ecx-nixl-agent)
  target_link_libraries(ecx_nixl_agent PRIVATE ecx_nixl_inproc)
  list(APPEND ECX_AGENTS ecx_nixl_agent)
endif()
