/* raw_request: engine-protocol requests written by hand on a raw socket
 * (kvh_raw_connect), for tests that must do what libkvnode never does:
 * send frames it would not, skip HELLO, never read the replies. */
#ifndef KVNODE_TEST_RAW_REQUEST_H
#define KVNODE_TEST_RAW_REQUEST_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"
#include "kvnode.pb-c.h"

/* One request as one frame. */
static inline void raw_send_request(int fd, const Kvnode__Request *req)
{
    size_t len = kvnode__request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(buf);
    kvnode__request__pack(req, buf);
    ck_assert_msg(kvh_raw_send_frame(fd, buf, (uint32_t)len) == 0, "%s", kvh_error());
    free(buf);
}

/* Layout l as HELLO carries it (pointing into l's strings; no extra). */
static inline Kvnode__Layout raw_layout(const kvnode_layout *l)
{
    Kvnode__Layout pl = KVNODE__LAYOUT__INIT;
    pl.model = (char *)l->model;
    pl.dtype = (char *)l->dtype;
    pl.block_tokens = l->block_tokens;
    pl.block_bytes = l->block_bytes;
    pl.num_layers = l->num_layers;
    pl.kv_heads = l->kv_heads;
    pl.head_dim = l->head_dim;
    pl.tp_size = l->tp_size;
    pl.tp_rank = l->tp_rank;
    pl.extra = (char *)"";
    return pl;
}

/* HELLO with layout l as client_name, declaring CUDA device `device` (-1:
 * none, host memory only); asserts it is accepted. How many HBM arenas the
 * reply lends (the descriptors it passes are closed unread). */
static inline size_t raw_hello_device(int fd, const kvnode_layout *l, const char *client_name, int device)
{
    Kvnode__Layout pl = raw_layout(l);
    Kvnode__HelloRequest h = KVNODE__HELLO_REQUEST__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.layout = &pl;
    h.client_name = (char *)client_name;
    h.cuda_device = device;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = 1000000;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &h;
    raw_send_request(fd, &req);
    uint8_t *payload;
    uint32_t len;
    ck_assert_msg(kvh_raw_recv_frame(fd, &payload, &len, 1u << 20, 5000) == 1, "HELLO: %s", kvh_error());
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp && !resp->error && resp->result_case == KVNODE__RESPONSE__RESULT_HELLO, "HELLO failed: %s",
                  resp && resp->error ? resp->error->message : "undecodable");
    size_t hbm = 0;
    for (size_t i = 0; i < resp->hello->n_arenas; i++)
        hbm += resp->hello->arenas[i]->tier == KVNODE__TIER__TIER_HBM;
    kvnode__response__free_unpacked(resp, NULL);
    return hbm;
}

/* HELLO with layout l (host memory only) as client_name; asserts it is
 * accepted. */
static inline void raw_hello(int fd, const kvnode_layout *l, const char *client_name)
{
    raw_hello_device(fd, l, client_name, -1);
}

/* n GET_INLINE requests of key, ids 1..n, sent in one write (about 30
 * bytes each): replies that pile up when the caller does not read. */
static inline void raw_send_get_inline_burst(int fd, int64_t key, int n)
{
    size_t total = 0;
    uint8_t *all = malloc((size_t)n * 32);
    ck_assert_ptr_nonnull(all);
    int64_t keys[1] = { key };
    for (int i = 0; i < n; i++) {
        Kvnode__GetInlineRequest g = KVNODE__GET_INLINE_REQUEST__INIT;
        g.n_keys = 1;
        g.keys = keys;
        Kvnode__Request req = KVNODE__REQUEST__INIT;
        req.id = (uint64_t)i + 1;
        req.op_case = KVNODE__REQUEST__OP_GET_INLINE;
        req.get_inline = &g;
        size_t len = kvnode__request__get_packed_size(&req);
        ck_assert_uint_lt(len, 28);
        all[total] = (uint8_t)len;
        all[total + 1] = all[total + 2] = all[total + 3] = 0;
        kvnode__request__pack(&req, all + total + 4);
        total += 4 + len;
    }
    ck_assert_int_eq(kvh_raw_send(fd, all, total), 0);
    free(all);
}

#endif
