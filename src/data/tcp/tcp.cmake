# SPDX-License-Identifier: Apache-2.0
# The tcp data path (always built): the producer sends the granted blocks
# over a socket of its own (data_tcp.c).
target_sources(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/data_tcp.c)
target_include_directories(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_include_directories(ecx_private PUBLIC ${CMAKE_CURRENT_LIST_DIR})
