//go:build cgo && !noverbs

package verbs

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
)

// ErrUnavailable is wrapped by the errors of Open and Devices when this
// machine cannot do RDMA: the libraries are not installed, or no device is
// there. The message says which.
var ErrUnavailable = errors.New("verbs: RDMA unavailable")

// Install is what a Debian machine needs for this package at run time.
const Install = "apt-get install rdma-core ibverbs-providers librdmacm1"

var (
	loadOnce sync.Once
	loadErr  error
)

// load opens libibverbs and librdmacm (once).
func load() error {
	loadOnce.Do(func() {
		var buf [512]C.char
		if C.np_load(&buf[0], C.int(len(buf))) != 0 {
			loadErr = fmt.Errorf("%w: %s (install rdma-core: %s)", ErrUnavailable, C.GoString(&buf[0]), Install)
		}
	})
	return loadErr
}

// errnoErr turns a negative errno from the shim into an error.
func errnoErr(rc C.int) error {
	if rc >= 0 {
		return nil
	}
	return syscall.Errno(-rc)
}

// Built reports whether this binary was built with verbs support (cgo and
// the rdma-core headers); without it every call fails with ErrUnavailable.
const Built = true
