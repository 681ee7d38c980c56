# SPDX-License-Identifier: Apache-2.0
# The shm data path (always built): a consumer on the producer's host copies
# the blocks out of the producer's region itself (data_shm.c), with the
# SIGBUS-safe copy of shm_copy.c.
target_sources(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/data_shm.c ${CMAKE_CURRENT_LIST_DIR}/shm_copy.c)
target_include_directories(ecx_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_include_directories(ecx_private PUBLIC ${CMAKE_CURRENT_LIST_DIR})
