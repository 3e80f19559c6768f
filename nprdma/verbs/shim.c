//go:build cgo && !noverbs

#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

// Function pointers, resolved by np_load.
static struct {
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
	int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
	void (*ack_async_event)(struct ibv_async_event *);
	const char *(*wc_status_str)(enum ibv_wc_status);

	struct rdma_event_channel *(*create_event_channel)(void);
	void (*destroy_event_channel)(struct rdma_event_channel *);
	int (*create_id)(struct rdma_event_channel *, struct rdma_cm_id **, void *, enum rdma_port_space);
	int (*destroy_id)(struct rdma_cm_id *);
	int (*bind_addr)(struct rdma_cm_id *, struct sockaddr *);
	int (*listen)(struct rdma_cm_id *, int);
	int (*resolve_addr)(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int);
	int (*resolve_route)(struct rdma_cm_id *, int);
	int (*connect)(struct rdma_cm_id *, struct rdma_conn_param *);
	int (*accept)(struct rdma_cm_id *, struct rdma_conn_param *);
	int (*reject)(struct rdma_cm_id *, const void *, uint8_t);
	int (*establish)(struct rdma_cm_id *);
	int (*disconnect)(struct rdma_cm_id *);
	int (*get_cm_event)(struct rdma_event_channel *, struct rdma_cm_event **);
	int (*ack_cm_event)(struct rdma_cm_event *);
	int (*init_qp_attr)(struct rdma_cm_id *, struct ibv_qp_attr *, int *);
	struct ibv_context **(*get_devices)(int *);
	void (*free_devices)(struct ibv_context **);
	const char *(*event_str)(enum rdma_cm_event_type);
} f;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_err[512];
static int load_rc = -1;

#define SYM(lib, field, name)                                                          \
	do {                                                                           \
		*(void **)(&f.field) = dlsym(lib, name);                               \
		if (!f.field) {                                                        \
			snprintf(load_err, sizeof load_err, "%s lacks %s", #lib, name); \
			return;                                                        \
		}                                                                      \
	} while (0)

static void load(void) {
	void *ibverbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!ibverbs) {
		snprintf(load_err, sizeof load_err, "libibverbs.so.1: %s", dlerror());
		return;
	}
	void *rdmacm = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!rdmacm) {
		snprintf(load_err, sizeof load_err, "librdmacm.so.1: %s", dlerror());
		return;
	}
	SYM(ibverbs, alloc_pd, "ibv_alloc_pd");
	SYM(ibverbs, dealloc_pd, "ibv_dealloc_pd");
	SYM(ibverbs, reg_mr, "ibv_reg_mr");
	SYM(ibverbs, dereg_mr, "ibv_dereg_mr");
	SYM(ibverbs, create_comp_channel, "ibv_create_comp_channel");
	SYM(ibverbs, destroy_comp_channel, "ibv_destroy_comp_channel");
	SYM(ibverbs, create_cq, "ibv_create_cq");
	SYM(ibverbs, destroy_cq, "ibv_destroy_cq");
	SYM(ibverbs, get_cq_event, "ibv_get_cq_event");
	SYM(ibverbs, ack_cq_events, "ibv_ack_cq_events");
	SYM(ibverbs, create_qp, "ibv_create_qp");
	SYM(ibverbs, destroy_qp, "ibv_destroy_qp");
	SYM(ibverbs, modify_qp, "ibv_modify_qp");
	SYM(ibverbs, query_device, "ibv_query_device");
	SYM(ibverbs, query_port, "ibv_query_port");
	SYM(ibverbs, get_async_event, "ibv_get_async_event");
	SYM(ibverbs, ack_async_event, "ibv_ack_async_event");
	SYM(ibverbs, wc_status_str, "ibv_wc_status_str");
	SYM(rdmacm, create_event_channel, "rdma_create_event_channel");
	SYM(rdmacm, destroy_event_channel, "rdma_destroy_event_channel");
	SYM(rdmacm, create_id, "rdma_create_id");
	SYM(rdmacm, destroy_id, "rdma_destroy_id");
	SYM(rdmacm, bind_addr, "rdma_bind_addr");
	SYM(rdmacm, listen, "rdma_listen");
	SYM(rdmacm, resolve_addr, "rdma_resolve_addr");
	SYM(rdmacm, resolve_route, "rdma_resolve_route");
	SYM(rdmacm, connect, "rdma_connect");
	SYM(rdmacm, accept, "rdma_accept");
	SYM(rdmacm, reject, "rdma_reject");
	SYM(rdmacm, establish, "rdma_establish");
	SYM(rdmacm, disconnect, "rdma_disconnect");
	SYM(rdmacm, get_cm_event, "rdma_get_cm_event");
	SYM(rdmacm, ack_cm_event, "rdma_ack_cm_event");
	SYM(rdmacm, init_qp_attr, "rdma_init_qp_attr");
	SYM(rdmacm, get_devices, "rdma_get_devices");
	SYM(rdmacm, free_devices, "rdma_free_devices");
	SYM(rdmacm, event_str, "rdma_event_str");
	load_rc = 0;
}

int np_load(char *err, int errlen) {
	pthread_once(&once, load);
	if (load_rc != 0)
		snprintf(err, errlen, "%s", load_err);
	return load_rc;
}

// errno after a call that failed with -1 (librdmacm) or returned an errno
// (libibverbs returns it directly).
static int rc_errno(int rc) {
	if (rc == 0)
		return 0;
	if (rc == -1)
		return errno ? -errno : -EIO;
	return rc > 0 ? -rc : rc;
}

// --- devices ---------------------------------------------------------------

struct ibv_context **np_get_devices(int *n) { return f.get_devices(n); }
void np_free_devices(struct ibv_context **l) { f.free_devices(l); }

int np_query(struct ibv_context *ctx, np_devinfo *out) {
	struct ibv_device_attr a;
	memset(out, 0, sizeof *out);
	int rc = f.query_device(ctx, &a);
	if (rc)
		return rc_errno(rc);
	snprintf(out->name, sizeof out->name, "%s", ctx->device->name);
	out->guid = a.node_guid;
	out->ports = a.phys_port_cnt;
	out->max_qp_wr = a.max_qp_wr;
	out->max_sge = a.max_sge;
	out->max_cqe = a.max_cqe;
	out->max_mr = a.max_mr;
	out->max_mr_size = a.max_mr_size;
	out->max_qp_rd_atom = a.max_qp_rd_atom;
	out->max_qp_init_rd_atom = a.max_qp_init_rd_atom;
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_device_ex);
	if (vctx) {
		struct ibv_device_attr_ex ax;
		memset(&ax, 0, sizeof ax);
		if (vctx->query_device_ex(ctx, NULL, &ax, sizeof ax) == 0) {
			out->odp_general = ax.odp_caps.general_caps;
			out->odp_rc = ax.odp_caps.per_transport_caps.rc_odp_caps;
		}
	}
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof pa);
	struct verbs_context *pctx = verbs_get_ctx_op(ctx, query_port);
	int prc = pctx ? pctx->query_port(ctx, 1, &pa, sizeof pa)
		       : f.query_port(ctx, 1, (struct _compat_ibv_port_attr *)&pa);
	if (prc == 0) {
		out->active_mtu = 128 << pa.active_mtu;
		out->link_layer = pa.link_layer;
	}
	return 0;
}

int np_set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int np_get_async_event(struct ibv_context *ctx, np_async_event *out) {
	struct ibv_async_event ev;
	if (f.get_async_event(ctx, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return errno ? -errno : -EIO;
	}
	out->event = ev.event_type;
	out->qp_num = 0;
	out->cq = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_CQ_ERR:
		out->cq = (uintptr_t)ev.element.cq;
		break;
	default:
		break;
	}
	f.ack_async_event(&ev);
	return 0;
}

// --- protection domains, memory regions ------------------------------------

struct ibv_pd *np_alloc_pd(struct ibv_context *ctx, int *err) {
	errno = 0;
	struct ibv_pd *pd = f.alloc_pd(ctx);
	*err = pd ? 0 : (errno ? errno : ENOMEM);
	return pd;
}

int np_dealloc_pd(struct ibv_pd *pd) { return rc_errno(f.dealloc_pd(pd)); }

struct ibv_mr *np_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int *err) {
	errno = 0;
	struct ibv_mr *mr = f.reg_mr(pd, (void *)addr, len, access);
	*err = mr ? 0 : (errno ? errno : EINVAL);
	return mr;
}

int np_dereg_mr(struct ibv_mr *mr) { return rc_errno(f.dereg_mr(mr)); }

// --- completion queues -----------------------------------------------------

struct ibv_comp_channel *np_create_channel(struct ibv_context *ctx, int *err) {
	errno = 0;
	struct ibv_comp_channel *ch = f.create_comp_channel(ctx);
	*err = ch ? 0 : (errno ? errno : ENOMEM);
	return ch;
}

int np_destroy_channel(struct ibv_comp_channel *ch) { return rc_errno(f.destroy_comp_channel(ch)); }

struct ibv_cq *np_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *ch, int *err) {
	errno = 0;
	struct ibv_cq *cq = f.create_cq(ctx, cqe, NULL, ch, 0);
	*err = cq ? 0 : (errno ? errno : ENOMEM);
	return cq;
}

int np_destroy_cq(struct ibv_cq *cq) { return rc_errno(f.destroy_cq(cq)); }

int np_req_notify(struct ibv_cq *cq) { return rc_errno(ibv_req_notify_cq(cq, 0)); }

int np_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (f.get_cq_event(ch, &cq, &ctx)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return errno ? -errno : -EIO;
	}
	f.ack_cq_events(cq, 1);
	return 1;
}

int np_poll(struct ibv_cq *cq, int n, np_wc *out) {
	struct ibv_wc wc[64];
	if (n > 64)
		n = 64;
	int got = ibv_poll_cq(cq, n, wc);
	if (got < 0)
		return got;
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].vendor_err = wc[i].vendor_err;
		out[i].byte_len = wc[i].byte_len;
		out[i].flags = wc[i].wc_flags;
		if (wc[i].wc_flags & IBV_WC_WITH_IMM)
			out[i].imm = ntohl(wc[i].imm_data);
		else
			out[i].imm = wc[i].invalidated_rkey;
		out[i].qp_num = wc[i].qp_num;
	}
	return got;
}

// --- queue pairs -----------------------------------------------------------

struct ibv_qp *np_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
	int send_wr, int recv_wr, int send_sge, int recv_sge, int inline_data, int *err,
	int *got_inline) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = send_sge;
	a.cap.max_recv_sge = recv_sge;
	a.cap.max_inline_data = inline_data;
	a.qp_type = IBV_QPT_RC;
	errno = 0;
	struct ibv_qp *qp = f.create_qp(pd, &a);
	*err = qp ? 0 : (errno ? errno : ENOMEM);
	*got_inline = qp ? (int)a.cap.max_inline_data : 0;
	return qp;
}

int np_destroy_qp(struct ibv_qp *qp) { return rc_errno(f.destroy_qp(qp)); }

uint32_t np_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

int np_qp_init(struct ibv_qp *qp, int port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.pkey_index = 0;
	a.qp_access_flags = access;
	return rc_errno(f.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

int np_qp_error(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return rc_errno(f.modify_qp(qp, &a, IBV_QP_STATE));
}

int np_post_send(struct ibv_qp *qp, np_swr *w, int n, np_sge *sges, uint8_t *inl, int *bad) {
	struct ibv_send_wr wr[64];
	struct ibv_sge sg[64 * 16];
	int k = 0;
	if (n > 64)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		memset(&wr[i], 0, sizeof wr[i]);
		wr[i].wr_id = w[i].wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].opcode = w[i].opcode;
		wr[i].send_flags = w[i].flags;
		wr[i].num_sge = w[i].nsge;
		wr[i].sg_list = w[i].nsge ? &sg[k] : NULL;
		for (uint32_t j = 0; j < w[i].nsge; j++, k++) {
			np_sge *s = &sges[w[i].first + j];
			sg[k].addr = (w[i].flags & IBV_SEND_INLINE) ? (uint64_t)(uintptr_t)inl + s->addr : s->addr;
			sg[k].length = s->length;
			sg[k].lkey = s->lkey;
		}
		switch (w[i].opcode) {
		case IBV_WR_SEND_WITH_IMM:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			wr[i].imm_data = htonl(w[i].imm);
			break;
		case IBV_WR_SEND_WITH_INV:
			wr[i].invalidate_rkey = w[i].imm;
			break;
		default:
			break;
		}
		wr[i].wr.rdma.remote_addr = w[i].raddr;
		wr[i].wr.rdma.rkey = w[i].rkey;
	}
	struct ibv_send_wr *badwr = NULL;
	int rc = ibv_post_send(qp, wr, &badwr);
	*bad = badwr ? (int)(badwr - wr) : n;
	return rc > 0 ? -rc : rc;
}

int np_post_recv(struct ibv_qp *qp, np_swr *w, int n, np_sge *sges, int *bad) {
	struct ibv_recv_wr wr[64];
	struct ibv_sge sg[64 * 16];
	int k = 0;
	if (n > 64)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		memset(&wr[i], 0, sizeof wr[i]);
		wr[i].wr_id = w[i].wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].num_sge = w[i].nsge;
		wr[i].sg_list = w[i].nsge ? &sg[k] : NULL;
		for (uint32_t j = 0; j < w[i].nsge; j++, k++) {
			np_sge *s = &sges[w[i].first + j];
			sg[k].addr = s->addr;
			sg[k].length = s->length;
			sg[k].lkey = s->lkey;
		}
	}
	struct ibv_recv_wr *badwr = NULL;
	int rc = ibv_post_recv(qp, wr, &badwr);
	*bad = badwr ? (int)(badwr - wr) : n;
	return rc > 0 ? -rc : rc;
}

// --- connection manager ----------------------------------------------------

struct rdma_event_channel *np_create_event_channel(int *err) {
	errno = 0;
	struct rdma_event_channel *ch = f.create_event_channel();
	*err = ch ? 0 : (errno ? errno : ENOMEM);
	return ch;
}

void np_destroy_event_channel(struct rdma_event_channel *ch) { f.destroy_event_channel(ch); }

int np_event_channel_fd(struct rdma_event_channel *ch) { return ch->fd; }

int np_get_cm_event(struct rdma_event_channel *ch, np_cm_event *out) {
	struct rdma_cm_event *ev;
	if (f.get_cm_event(ch, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return errno ? -errno : -EIO;
	}
	memset(out, 0, sizeof *out);
	out->event = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	const struct rdma_conn_param *p = &ev->param.conn;
	if (p->private_data && p->private_data_len) {
		int n = p->private_data_len;
		if (n > (int)sizeof out->pdata)
			n = sizeof out->pdata;
		memcpy(out->pdata, p->private_data, n);
		out->pdata_len = n;
	}
	out->initiator_depth = p->initiator_depth;
	out->responder_resources = p->responder_resources;
	out->rnr_retry = p->rnr_retry_count;
	out->retry = p->retry_count;
	out->qp_num = p->qp_num;
	f.ack_cm_event(ev);
	return 0;
}

struct rdma_cm_id *np_create_id(struct rdma_event_channel *ch, int *err) {
	struct rdma_cm_id *id = NULL;
	int rc = f.create_id(ch, &id, NULL, RDMA_PS_TCP);
	*err = rc ? (errno ? errno : EINVAL) : 0;
	return rc ? NULL : id;
}

int np_destroy_id(struct rdma_cm_id *id) { return rc_errno(f.destroy_id(id)); }

static socklen_t to_sockaddr(np_addr *a, struct sockaddr_storage *ss) {
	memset(ss, 0, sizeof *ss);
	if (a->family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(a->port);
		memcpy(&s->sin6_addr, a->addr, 16);
		return sizeof *s;
	}
	struct sockaddr_in *s = (struct sockaddr_in *)ss;
	s->sin_family = AF_INET;
	s->sin_port = htons(a->port);
	memcpy(&s->sin_addr, a->addr, 4);
	return sizeof *s;
}

static void from_sockaddr(struct sockaddr *sa, np_addr *out) {
	memset(out, 0, sizeof *out);
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		out->family = AF_INET6;
		out->port = ntohs(s->sin6_port);
		memcpy(out->addr, &s->sin6_addr, 16);
	} else if (sa->sa_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		out->family = AF_INET;
		out->port = ntohs(s->sin_port);
		memcpy(out->addr, &s->sin_addr, 4);
	}
}

int np_bind_listen(struct rdma_cm_id *id, np_addr *a, int backlog) {
	struct sockaddr_storage ss;
	to_sockaddr(a, &ss);
	int rc = f.bind_addr(id, (struct sockaddr *)&ss);
	if (rc)
		return rc_errno(rc);
	return rc_errno(f.listen(id, backlog));
}

int np_resolve_addr(struct rdma_cm_id *id, np_addr *dst, int timeout_ms) {
	struct sockaddr_storage ss;
	to_sockaddr(dst, &ss);
	return rc_errno(f.resolve_addr(id, NULL, (struct sockaddr *)&ss, timeout_ms));
}

int np_resolve_route(struct rdma_cm_id *id, int timeout_ms) { return rc_errno(f.resolve_route(id, timeout_ms)); }

struct ibv_context *np_id_verbs(struct rdma_cm_id *id) { return id->verbs; }

int np_id_addr(struct rdma_cm_id *id, int peer, np_addr *out) {
	from_sockaddr(peer ? rdma_get_peer_addr(id) : rdma_get_local_addr(id), out);
	return 0;
}

int np_modify_cm(struct rdma_cm_id *id, struct ibv_qp *qp, int state, int rd_atomic, int rnr) {
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	int rc = f.init_qp_attr(id, &a, &mask);
	if (rc)
		return rc_errno(rc);
	if (state == IBV_QPS_INIT) {
		// Every right the queue pair's regions may grant: the regions'
		// own rights decide.
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
		mask |= IBV_QP_ACCESS_FLAGS;
	} else if (state == IBV_QPS_RTR) {
		if (rd_atomic > 0)
			a.max_dest_rd_atomic = rd_atomic;
		if (rnr >= 0)
			a.min_rnr_timer = rnr;
	} else if (state == IBV_QPS_RTS) {
		if (rd_atomic > 0)
			a.max_rd_atomic = rd_atomic;
		if (rnr >= 0)
			a.rnr_retry = rnr;
	}
	return rc_errno(f.modify_qp(qp, &a, mask));
}

static void conn_param(struct rdma_conn_param *p, uint32_t qp_num, const uint8_t *pdata, int pdlen,
	int responder_resources, int initiator_depth, int rnr_retry) {
	memset(p, 0, sizeof *p);
	p->private_data = pdlen ? pdata : NULL;
	p->private_data_len = pdlen;
	p->responder_resources = responder_resources;
	p->initiator_depth = initiator_depth;
	p->flow_control = 1;
	p->retry_count = 7;
	p->rnr_retry_count = rnr_retry;
	p->qp_num = qp_num;
}

int np_connect(struct rdma_cm_id *id, uint32_t qp_num, const uint8_t *pdata, int pdlen,
	int responder_resources, int initiator_depth, int rnr_retry) {
	struct rdma_conn_param p;
	conn_param(&p, qp_num, pdata, pdlen, responder_resources, initiator_depth, rnr_retry);
	return rc_errno(f.connect(id, &p));
}

int np_accept(struct rdma_cm_id *id, uint32_t qp_num, const uint8_t *pdata, int pdlen,
	int responder_resources, int initiator_depth, int rnr_retry) {
	struct rdma_conn_param p;
	conn_param(&p, qp_num, pdata, pdlen, responder_resources, initiator_depth, rnr_retry);
	return rc_errno(f.accept(id, &p));
}

int np_reject(struct rdma_cm_id *id, const uint8_t *pdata, int pdlen) {
	return rc_errno(f.reject(id, pdlen ? pdata : NULL, pdlen));
}

int np_establish(struct rdma_cm_id *id) { return rc_errno(f.establish(id)); }

int np_disconnect(struct rdma_cm_id *id) { return rc_errno(f.disconnect(id)); }

const char *np_event_str(int event) { return f.event_str(event); }

const char *np_wc_status_str(int status) { return f.wc_status_str(status); }
