# SPDX-License-Identifier: Apache-2.0
# The nixl data path (ECX_WITH_NIXL; needs the ucx path's UCX). libecx holds
# NIXL's formats (nixl_format.c), the path (data_nixl.c) and the client of
# the NIXL agent process (nixl_proc.c); the agent itself (nixl_agent.c, UCX)
# runs in ecx-nixl-agent (agents/nixl_agent_main.c): the library
# ecx_nixl_inproc, for that program and the tests.
target_sources(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nixl_format.c
  ${CMAKE_CURRENT_LIST_DIR}/nixl_proc.c ${CMAKE_CURRENT_LIST_DIR}/data_nixl.c)
target_include_directories(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(ecx_obj PRIVATE ECX_WITH_NIXL)
target_compile_definitions(ecx_private PUBLIC ECX_WITH_NIXL)  # the tests ask it too
target_include_directories(ecx_private PUBLIC ${CMAKE_CURRENT_LIST_DIR})

add_library(ecx_nixl_inproc STATIC ${CMAKE_CURRENT_LIST_DIR}/nixl_agent.c)
target_link_libraries(ecx_nixl_inproc PUBLIC ecx_ucx_inproc)  # UCX, its log set-up
ecx_library_settings(ecx_nixl_inproc)
list(APPEND ECX_INPROC_LIBS ecx_nixl_inproc)
