/* SPDX-License-Identifier: Apache-2.0 */
/*
 * paths — the registration table of the data paths (data_impl.h,
 * ecxi_data_path): the one place that knows every path's constructors, so
 * that the front (data.c) and the auto policy (data_auto.c) reach a path
 * by its number and name alone. A path this libecx is built without
 * (ECX_WITH_UCX, ECX_WITH_NIXL: its folder's CMake fragment) keeps its
 * name here, with no constructor.
 */
#include "data_impl.h"

static int shm_start(ecxi_region *r, const ecxi_data_opts *opts, int role, ecxi_data_meta *m,
                     ecxi_data_desc *dd, ecxi_data **out)
{
    (void)opts;
    return role == ECXI_DATA_PRODUCER ? ecxi_data_shm_new_producer(r, m, dd, out)
                                     : ecxi_data_shm_new_consumer(r, out);
}

static int tcp_start(ecxi_region *r, const ecxi_data_opts *opts, int role, ecxi_data_meta *m,
                     ecxi_data_desc *dd, ecxi_data **out)
{
    (void)dd;
    return role == ECXI_DATA_PRODUCER ? ecxi_data_tcp_new_producer(r, opts, m, out)
                                     : ecxi_data_tcp_new_consumer(r, out);
}

#ifdef ECX_WITH_UCX
static int ucx_start(ecxi_region *r, const ecxi_data_opts *opts, int role, ecxi_data_meta *m,
                     ecxi_data_desc *dd, ecxi_data **out)
{
    (void)dd;
    return role == ECXI_DATA_PRODUCER ? ecxi_ucx_proc_new_producer(r, opts, m, out)
                                     : ecxi_ucx_proc_new_consumer(r, out);
}
#else
#define ucx_start NULL
#endif

#ifdef ECX_WITH_NIXL
static int nixl_start(ecxi_region *r, const ecxi_data_opts *opts, int role, ecxi_data_meta *m,
                      ecxi_data_desc *dd, ecxi_data **out)
{
    (void)m, (void)dd; /* the producer publishes NIXL's metadata, made by the path */
    return role == ECXI_DATA_PRODUCER ? ecxi_data_nixl_new_producer(r, opts, out)
                                     : ecxi_data_nixl_new_consumer(r, opts, out);
}
#else
#define nixl_start NULL
#endif

const ecxi_data_path ecxi_data_paths[ECXI_DATA_BACKEND_COUNT] = {
    [ECX_DATA_AUTO] = {ecxi_data_auto_new},
    [ECX_DATA_SHM] = {shm_start},
    [ECX_DATA_UCX] = {ucx_start},
    [ECX_DATA_TCP] = {tcp_start},
    [ECX_DATA_NIXL] = {nixl_start},
};
