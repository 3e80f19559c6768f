// The C side of nprdma/verbs: libibverbs and librdmacm loaded at run time
// (dlopen), so that a binary built here starts on a machine without
// rdma-core. Only the structure layouts come from the -dev headers; every
// exported function is called through a pointer np_load resolved, and the
// inline helpers used (ibv_post_send, ibv_post_recv, ibv_poll_cq,
// ibv_req_notify_cq) go through the device's own ops table.

#ifndef NPRDMA_VERBS_SHIM_H
#define NPRDMA_VERBS_SHIM_H

#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// np_load loads both libraries once. 0 on success; otherwise -1 with a
// message in err naming the missing library or symbol.
int np_load(char *err, int errlen);

// --- devices ---------------------------------------------------------------

typedef struct {
	char name[64];
	uint64_t guid;
	int ports;
	int max_qp_wr, max_sge, max_cqe, max_mr, max_qp_rd_atom, max_qp_init_rd_atom;
	uint64_t max_mr_size;
	uint64_t odp_general, odp_rc; // IBV_ODP_* and IBV_ODP_SUPPORT_* of RC
	int active_mtu;               // bytes
	int link_layer;               // IBV_LINK_LAYER_*
} np_devinfo;

struct ibv_context **np_get_devices(int *n);
void np_free_devices(struct ibv_context **l);
int np_query(struct ibv_context *ctx, np_devinfo *out);
int np_set_nonblock(int fd);

typedef struct {
	int event;   // IBV_EVENT_*
	uint32_t qp_num; // for QP events
	uintptr_t cq;    // for CQ events
} np_async_event;

// np_get_async_event reads one async event (the fd is non-blocking): 0 with
// *out filled, -EAGAIN when none is pending, or -errno.
int np_get_async_event(struct ibv_context *ctx, np_async_event *out);

// --- protection domains, memory regions ------------------------------------

struct ibv_pd *np_alloc_pd(struct ibv_context *ctx, int *err);
int np_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *np_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int *err);
int np_dereg_mr(struct ibv_mr *mr);

// --- completion queues -----------------------------------------------------

typedef struct {
	uint64_t wr_id;
	uint32_t status, opcode, vendor_err, byte_len, imm, qp_num, flags, pad;
} np_wc;

struct ibv_comp_channel *np_create_channel(struct ibv_context *ctx, int *err);
int np_destroy_channel(struct ibv_comp_channel *ch);
struct ibv_cq *np_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *ch, int *err);
int np_destroy_cq(struct ibv_cq *cq);
int np_req_notify(struct ibv_cq *cq);
// np_get_cq_event takes one event from the (non-blocking) channel and acks
// it: 1 if there was one, 0 if none, -errno.
int np_get_cq_event(struct ibv_comp_channel *ch);
// np_poll polls up to n completions (n <= 64): how many, or -errno.
int np_poll(struct ibv_cq *cq, int n, np_wc *out);

// --- queue pairs -----------------------------------------------------------

typedef struct {
	uint64_t wr_id;
	uint64_t raddr;
	uint32_t opcode, flags, imm, rkey;
	uint32_t nsge, first; // the SGEs: sges[first .. first+nsge)
} np_swr;

typedef struct {
	uint64_t addr;
	uint32_t length, lkey;
} np_sge;

struct ibv_qp *np_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
	int send_wr, int recv_wr, int send_sge, int recv_sge, int inline_data, int *err,
	int *got_inline);
int np_destroy_qp(struct ibv_qp *qp);
uint32_t np_qp_num(struct ibv_qp *qp);
int np_qp_init(struct ibv_qp *qp, int port, int access);
int np_qp_error(struct ibv_qp *qp);
// np_post_send posts n work requests (n <= 64, SGEs <= 16 each); inline
// payloads are SGEs whose addr is an offset into inl. *bad is the index of
// the first request not posted.
int np_post_send(struct ibv_qp *qp, np_swr *w, int n, np_sge *sges, uint8_t *inl, int *bad);
int np_post_recv(struct ibv_qp *qp, np_swr *w, int n, np_sge *sges, int *bad);

// --- connection manager ----------------------------------------------------

typedef struct {
	int event, status;
	struct rdma_cm_id *id, *listen_id;
	uint8_t pdata[256];
	int pdata_len;
	uint8_t initiator_depth, responder_resources, rnr_retry, retry;
	uint32_t qp_num;
} np_cm_event;

typedef struct {
	int family; // AF_INET, AF_INET6
	uint8_t addr[16];
	uint16_t port;
} np_addr;

struct rdma_event_channel *np_create_event_channel(int *err);
void np_destroy_event_channel(struct rdma_event_channel *ch);
int np_event_channel_fd(struct rdma_event_channel *ch);
int np_get_cm_event(struct rdma_event_channel *ch, np_cm_event *out);
struct rdma_cm_id *np_create_id(struct rdma_event_channel *ch, int *err);
int np_destroy_id(struct rdma_cm_id *id);
int np_bind_listen(struct rdma_cm_id *id, np_addr *a, int backlog);
int np_resolve_addr(struct rdma_cm_id *id, np_addr *dst, int timeout_ms);
int np_resolve_route(struct rdma_cm_id *id, int timeout_ms);
struct ibv_context *np_id_verbs(struct rdma_cm_id *id);
// np_id_addr reads the local (peer=0) or remote (peer=1) address.
int np_id_addr(struct rdma_cm_id *id, int peer, np_addr *out);
// np_modify_cm moves qp to state (INIT, RTR, RTS) with the attributes the
// connection manager gives for id; rd_atomic > 0 replaces max_dest_rd_atomic
// (RTR) or max_rd_atomic (RTS); rnr >= 0 replaces min_rnr_timer (RTR) or
// rnr_retry (RTS).
int np_modify_cm(struct rdma_cm_id *id, struct ibv_qp *qp, int state, int rd_atomic, int rnr);
int np_connect(struct rdma_cm_id *id, uint32_t qp_num, const uint8_t *pdata, int pdlen,
	int responder_resources, int initiator_depth, int rnr_retry);
int np_accept(struct rdma_cm_id *id, uint32_t qp_num, const uint8_t *pdata, int pdlen,
	int responder_resources, int initiator_depth, int rnr_retry);
int np_reject(struct rdma_cm_id *id, const uint8_t *pdata, int pdlen);
int np_establish(struct rdma_cm_id *id);
int np_disconnect(struct rdma_cm_id *id);
const char *np_event_str(int event);
const char *np_wc_status_str(int status);

#endif
