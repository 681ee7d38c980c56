# SPDX-License-Identifier: Apache-2.0
# The ucx data path (ECX_WITH_UCX). libecx holds only ucx_proc.c, which runs
# UCX in a helper process, ecx-ucx-agent (agents/ucx_agent_main.c), and
# talks to it; libecx never links UCX. data_ucx.c is UCX itself, in that
# process: the library ecx_ucx_inproc, for the agent and the tests.
target_sources(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_proc.c)
target_include_directories(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(ecx_obj PRIVATE ECX_WITH_UCX)
target_compile_definitions(ecx_private PUBLIC ECX_WITH_UCX)  # the tests ask it too
target_include_directories(ecx_private PUBLIC ${CMAKE_CURRENT_LIST_DIR})

add_library(ecx_ucx_inproc STATIC ${CMAKE_CURRENT_LIST_DIR}/data_ucx.c)
target_link_libraries(ecx_ucx_inproc PUBLIC ecx_private PkgConfig::UCX)
ecx_library_settings(ecx_ucx_inproc)
list(APPEND ECX_INPROC_LIBS ecx_ucx_inproc)
