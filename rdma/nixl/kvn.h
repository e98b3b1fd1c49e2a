// kvn.h: kvtier's own declarations of the few NIXL C API functions it
// calls (NIXL 1.x, libnixl_capi.so; NIXL installs no header) and the small
// trampolines cgo calls them through. Only files built with -tags nixl and
// cgo include it.
#ifndef KVTIER_NIXL_KVN_H
#define KVTIER_NIXL_KVN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Our own declarations of the few NIXL C API functions used (NIXL 1.x,
// libnixl_capi.so). Handles are opaque pointers; statuses are int-sized
// enums. The API installs no header, and none is needed to build this file.
typedef int kvn_status;
typedef void *kvn_h;

// kvn_api is the dlsym'ed function table. Its fields are all function
// pointers, in the order of kvn_names (capi.go).
typedef struct {
	bool (*is_stub)(void);
	kvn_status (*create_configured_agent)(const char *, const void *, kvn_h *);
	kvn_status (*destroy_agent)(kvn_h);
	kvn_status (*create_params)(kvn_h *);
	kvn_status (*params_add)(kvn_h, const char *, const char *);
	kvn_status (*destroy_params)(kvn_h);
	kvn_status (*create_backend)(kvn_h, const char *, kvn_h, kvn_h *);
	kvn_status (*destroy_backend)(kvn_h);
	kvn_status (*create_opt_args)(kvn_h *);
	kvn_status (*destroy_opt_args)(kvn_h);
	kvn_status (*opt_args_add_backend)(kvn_h, kvn_h);
	kvn_status (*opt_args_set_notif_msg)(kvn_h, const void *, size_t);
	kvn_status (*opt_args_set_has_notif)(kvn_h, bool);
	kvn_status (*create_reg_dlist)(int, kvn_h *);
	kvn_status (*reg_dlist_add_desc)(kvn_h, uintptr_t, size_t, uint64_t, const void *, size_t);
	kvn_status (*destroy_reg_dlist)(kvn_h);
	kvn_status (*register_mem)(kvn_h, kvn_h, kvn_h);
	kvn_status (*deregister_mem)(kvn_h, kvn_h, kvn_h);
	kvn_status (*get_local_md)(kvn_h, void **, size_t *);
	kvn_status (*load_remote_md)(kvn_h, const void *, size_t, char **);
	kvn_status (*invalidate_remote_md)(kvn_h, const char *);
	kvn_status (*create_xfer_dlist)(int, kvn_h *);
	kvn_status (*xfer_dlist_add_desc)(kvn_h, uintptr_t, size_t, uint64_t);
	kvn_status (*destroy_xfer_dlist)(kvn_h);
	kvn_status (*prep_xfer_dlist)(kvn_h, const char *, kvn_h, kvn_h *, kvn_h);
	kvn_status (*release_xfer_dlist_handle)(kvn_h, kvn_h);
	kvn_status (*make_xfer_req)(kvn_h, int, kvn_h, const int *, size_t, kvn_h, const int *, size_t, kvn_h *, kvn_h);
	kvn_status (*post_xfer_req)(kvn_h, kvn_h, kvn_h);
	kvn_status (*get_xfer_status)(kvn_h, kvn_h);
	kvn_status (*release_xfer_req)(kvn_h, kvn_h);
	kvn_status (*destroy_xfer_req)(kvn_h);
	kvn_status (*create_notif_map)(kvn_h *);
	kvn_status (*destroy_notif_map)(kvn_h);
	kvn_status (*get_notifs)(kvn_h, kvn_h, kvn_h);
	kvn_status (*notif_map_size)(kvn_h, size_t *);
	kvn_status (*notif_map_get_agent_at)(kvn_h, size_t, const char **);
	kvn_status (*notif_map_get_notifs_size)(kvn_h, const char *, size_t *);
	kvn_status (*notif_map_get_notif)(kvn_h, const char *, size_t, const void **, size_t *);
	kvn_status (*notif_map_clear)(kvn_h);
} kvn_api;

enum { KVN_MEM_DRAM = 0, KVN_OP_WRITE = 1 };

static inline bool kvn_is_stub(kvn_api *a) { return a->is_stub(); }

// kvn_create_agent creates an agent with an all-zero configuration: no
// progress thread, no listener thread, no etcd, thread-sync mode NONE. Zero
// is "off" for every field of nixl_capi_agent_config_t, so an oversized
// zeroed buffer stays right if the struct grows.
static inline kvn_status kvn_create_agent(kvn_api *a, const char *name, kvn_h *agent) {
	unsigned char cfg[256];
	memset(cfg, 0, sizeof cfg);
	return a->create_configured_agent(name, cfg, agent);
}

static inline kvn_status kvn_destroy_agent(kvn_api *a, kvn_h agent) { return a->destroy_agent(agent); }

static inline kvn_status kvn_create_params(kvn_api *a, kvn_h *p) { return a->create_params(p); }
static inline kvn_status kvn_params_add(kvn_api *a, kvn_h p, const char *k, const char *v) { return a->params_add(p, k, v); }
static inline kvn_status kvn_destroy_params(kvn_api *a, kvn_h p) { return a->destroy_params(p); }
static inline kvn_status kvn_create_backend(kvn_api *a, kvn_h agent, const char *plugin, kvn_h params, kvn_h *b) {
	return a->create_backend(agent, plugin, params, b);
}
static inline kvn_status kvn_destroy_backend(kvn_api *a, kvn_h b) { return a->destroy_backend(b); }

// kvn_opt makes opt args naming backend b (NULL on failure).
static inline kvn_h kvn_opt(kvn_api *a, kvn_h b) {
	kvn_h o = NULL;
	if (a->create_opt_args(&o) != 0) return NULL;
	if (b != NULL && a->opt_args_add_backend(o, b) != 0) {
		a->destroy_opt_args(o);
		return NULL;
	}
	return o;
}

// kvn_register (dereg = false) or deregisters (dereg = true) [base,
// base+len) as one DRAM descriptor with backend b.
static inline kvn_status kvn_register(kvn_api *a, kvn_h agent, kvn_h b, uintptr_t base, size_t len, bool dereg) {
	kvn_h dl = NULL;
	kvn_status st = a->create_reg_dlist(KVN_MEM_DRAM, &dl);
	if (st != 0) return st;
	st = a->reg_dlist_add_desc(dl, base, len, 0, NULL, 0);
	if (st == 0) {
		kvn_h o = kvn_opt(a, b);
		st = dereg ? a->deregister_mem(agent, dl, o) : a->register_mem(agent, dl, o);
		if (o != NULL) a->destroy_opt_args(o);
	}
	a->destroy_reg_dlist(dl);
	return st;
}

static inline kvn_status kvn_get_local_md(kvn_api *a, kvn_h agent, void **data, size_t *len) {
	return a->get_local_md(agent, data, len);
}
static inline kvn_status kvn_load_remote_md(kvn_api *a, kvn_h agent, const void *data, size_t len, char **name) {
	return a->load_remote_md(agent, data, len, name);
}
static inline kvn_status kvn_invalidate_remote_md(kvn_api *a, kvn_h agent, const char *name) {
	return a->invalidate_remote_md(agent, name);
}

// kvn_prep_slots prepares n slot descriptors (base + i*slot_bytes) of
// agent_name's memory ("" = local) once, for make_xfer_req's indices.
static inline kvn_status kvn_prep_slots(kvn_api *a, kvn_h agent, kvn_h b, const char *agent_name,
	uintptr_t base, size_t slot_bytes, size_t n, kvn_h *handle) {
	kvn_h dl = NULL;
	kvn_status st = a->create_xfer_dlist(KVN_MEM_DRAM, &dl);
	if (st != 0) return st;
	for (size_t i = 0; i < n && st == 0; i++) {
		st = a->xfer_dlist_add_desc(dl, base + i * slot_bytes, slot_bytes, 0);
	}
	if (st == 0) {
		kvn_h o = kvn_opt(a, b);
		st = a->prep_xfer_dlist(agent, agent_name, dl, handle, o);
		if (o != NULL) a->destroy_opt_args(o);
	}
	a->destroy_xfer_dlist(dl);
	return st;
}

static inline kvn_status kvn_release_dlist(kvn_api *a, kvn_h agent, kvn_h h) {
	return a->release_xfer_dlist_handle(agent, h);
}

// kvn_write makes one WRITE request from local slots src into remote slots
// dst with a notification, and posts it. *req is NULL when the request
// could not be made; otherwise the caller owns it (kvn_release_req), even
// when the post failed. *posted tells which step the status is from.
static inline kvn_status kvn_write(kvn_api *a, kvn_h agent, kvn_h b, kvn_h local, const int *src,
	kvn_h remote, const int *dst, size_t n, const void *msg, size_t msg_len, kvn_h *req, bool *posted) {
	*req = NULL;
	*posted = false;
	kvn_h o = kvn_opt(a, b);
	if (o == NULL) return -2;
	kvn_status st = a->opt_args_set_notif_msg(o, msg, msg_len);
	if (st == 0) st = a->opt_args_set_has_notif(o, true);
	if (st == 0) st = a->make_xfer_req(agent, KVN_OP_WRITE, local, src, n, remote, dst, n, req, o);
	if (st == 0) {
		*posted = true;
		st = a->post_xfer_req(agent, *req, o);
	} else {
		*req = NULL;
	}
	a->destroy_opt_args(o);
	return st;
}

static inline kvn_status kvn_xfer_status(kvn_api *a, kvn_h agent, kvn_h req) { return a->get_xfer_status(agent, req); }

// kvn_release_req releases (cancelling what UCX has not sent) and frees req.
static inline kvn_status kvn_release_req(kvn_api *a, kvn_h agent, kvn_h req) {
	kvn_status st = a->release_xfer_req(agent, req);
	if (st == 0) a->destroy_xfer_req(req);
	return st;
}

static inline kvn_status kvn_create_notif_map(kvn_api *a, kvn_h *m) { return a->create_notif_map(m); }
static inline kvn_status kvn_destroy_notif_map(kvn_api *a, kvn_h m) { return a->destroy_notif_map(m); }
static inline kvn_status kvn_get_notifs(kvn_api *a, kvn_h agent, kvn_h m) { return a->get_notifs(agent, m, NULL); }
static inline kvn_status kvn_notif_map_size(kvn_api *a, kvn_h m, size_t *n) { return a->notif_map_size(m, n); }
static inline kvn_status kvn_notif_agent_at(kvn_api *a, kvn_h m, size_t i, const char **name) {
	return a->notif_map_get_agent_at(m, i, name);
}
static inline kvn_status kvn_notifs_size(kvn_api *a, kvn_h m, const char *name, size_t *n) {
	return a->notif_map_get_notifs_size(m, name, n);
}
static inline kvn_status kvn_notif(kvn_api *a, kvn_h m, const char *name, size_t i, const void **data, size_t *len) {
	return a->notif_map_get_notif(m, name, i, data, len);
}
static inline kvn_status kvn_notif_map_clear(kvn_api *a, kvn_h m) { return a->notif_map_clear(m); }

#endif
