//go:build nixl && cgo

package nixl

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include "kvn.h"

// kvn_names are the symbols kvn_api's fields are filled from, in order.
static const char *const kvn_names[] = {
	"nixl_capi_is_stub",
	"nixl_capi_create_configured_agent",
	"nixl_capi_destroy_agent",
	"nixl_capi_create_params",
	"nixl_capi_params_add",
	"nixl_capi_destroy_params",
	"nixl_capi_create_backend",
	"nixl_capi_destroy_backend",
	"nixl_capi_create_opt_args",
	"nixl_capi_destroy_opt_args",
	"nixl_capi_opt_args_add_backend",
	"nixl_capi_opt_args_set_notif_msg",
	"nixl_capi_opt_args_set_has_notif",
	"nixl_capi_create_reg_dlist",
	"nixl_capi_reg_dlist_add_desc",
	"nixl_capi_destroy_reg_dlist",
	"nixl_capi_register_mem",
	"nixl_capi_deregister_mem",
	"nixl_capi_get_local_md",
	"nixl_capi_load_remote_md",
	"nixl_capi_invalidate_remote_md",
	"nixl_capi_create_xfer_dlist",
	"nixl_capi_xfer_dlist_add_desc",
	"nixl_capi_destroy_xfer_dlist",
	"nixl_capi_prep_xfer_dlist",
	"nixl_capi_release_xfer_dlist_handle",
	"nixl_capi_make_xfer_req",
	"nixl_capi_post_xfer_req",
	"nixl_capi_get_xfer_status",
	"nixl_capi_release_xfer_req",
	"nixl_capi_destroy_xfer_req",
	"nixl_capi_create_notif_map",
	"nixl_capi_destroy_notif_map",
	"nixl_capi_get_notifs",
	"nixl_capi_notif_map_size",
	"nixl_capi_notif_map_get_agent_at",
	"nixl_capi_notif_map_get_notifs_size",
	"nixl_capi_notif_map_get_notif",
	"nixl_capi_notif_map_clear",
};

#define KVN_NFUNCS (sizeof(kvn_names) / sizeof(kvn_names[0]))
_Static_assert(sizeof(kvn_api) == KVN_NFUNCS * sizeof(void (*)(void)), "kvn_api and kvn_names disagree");

// kvn_open dlopens path and fills api. On failure it returns NULL with the
// reason in err (dlerror's text, or the first missing symbol).
static void *kvn_open(const char *path, kvn_api *api, char *err, size_t errlen) {
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	void (**slot)(void) = (void (**)(void))api;
	for (size_t i = 0; i < KVN_NFUNCS; i++) {
		void *f = dlsym(h, kvn_names[i]);
		if (f == NULL) {
			snprintf(err, errlen, "missing symbol %s", kvn_names[i]);
			dlclose(h);
			return NULL;
		}
		memcpy(&slot[i], &f, sizeof f);
	}
	return h;
}

// kvn_loaded_path is the file the loader actually mapped for h.
static const char *kvn_loaded_path(void *h) {
	struct link_map *lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL) return "";
	return lm->l_name;
}

*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvtier/kvtier/rdma"
)

// library is one dlopen'ed libnixl_capi.so. It is never dlclose'd:
// unloading a C++ library that started UCX threads is not safe.
type library struct {
	api     *C.kvn_api // C memory: stable for the C trampolines
	path    string     // as asked
	loaded  string     // the file the loader mapped
	version string
}

var (
	libMu   sync.Mutex
	libs    = map[string]*library{}
	pluginM sync.Once
)

// loadLibrary dlopens path once per process and checks it is the real C
// API this package was written against.
func loadLibrary(path string) (*library, error) {
	libMu.Lock()
	defer libMu.Unlock()
	if l, ok := libs[path]; ok {
		return l, nil
	}
	api := (*C.kvn_api)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvn_api{}))))
	if api == nil {
		return nil, fmt.Errorf("nixl: out of memory: %w", rdma.ErrUnavailable)
	}
	var errbuf [512]C.char
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := C.kvn_open(cpath, api, &errbuf[0], C.size_t(len(errbuf)))
	if h == nil {
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("nixl: load %s: %s: %w", path, C.GoString(&errbuf[0]), rdma.ErrUnavailable)
	}
	if bool(C.kvn_is_stub(api)) {
		// The stub build answers every call with an error; keep it loaded
		// (it is harmless) but refuse it.
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("nixl: %s is NIXL's stub C API (built without the NIXL core): %w", path, rdma.ErrUnavailable)
	}
	l := &library{api: api, path: path, loaded: C.GoString(C.kvn_loaded_path(h))}
	if l.loaded == "" {
		l.loaded = path
	}
	l.version = packageVersion(l.loaded)
	libs[path] = l
	return l, nil
}

// setPluginDir exports NIXL_PLUGIN_DIR before the process's first agent
// (NIXL's plugin manager reads it once). os.Setenv reaches C's environ
// when cgo is linked.
func setPluginDir(dir string) {
	if dir == "" {
		return
	}
	pluginM.Do(func() {
		if os.Getenv(EnvPluginDir) == "" {
			os.Setenv(EnvPluginDir, dir)
		}
	})
}

// packageVersion finds the version of the Python wheel that shipped the
// library (…/site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so next to
// …/site-packages/nixl_cu12-1.5.1.dist-info), best effort.
func packageVersion(lib string) string {
	site := filepath.Dir(filepath.Dir(lib))
	matches, _ := filepath.Glob(filepath.Join(site, "nixl*.dist-info"))
	for _, m := range matches {
		name := strings.TrimSuffix(filepath.Base(m), ".dist-info")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			return name[:i] + " " + name[i+1:]
		}
	}
	return ""
}

// status converts a C status.
func status(s C.kvn_status) Status { return Status(s) }

// callErr is nil for success, else an *Error of kind.
func callErr(op string, s C.kvn_status, kind error) error {
	if s == 0 {
		return nil
	}
	return &Error{Op: op, Status: status(s), Kind: kind}
}
