//go:build !cgo || noverbs

package verbs

import (
	"errors"
	"fmt"

	"github.com/nprdma/nprdma/nprdma"
)

// ErrUnavailable is wrapped by the errors of Open and Devices when this
// machine cannot do RDMA; in this build, always.
var ErrUnavailable = errors.New("verbs: RDMA unavailable")

// Install is what a Debian machine needs for this package at run time.
const Install = "apt-get install rdma-core ibverbs-providers librdmacm1"

// Built reports whether this binary was built with verbs support. It was
// not: it was built without cgo or with the noverbs tag.
const Built = false

var errNotBuilt = fmt.Errorf("%w: this binary was built without verbs support (cgo off or the noverbs build tag; build with cgo and libibverbs-dev, librdmacm-dev)", ErrUnavailable)

// Info describes an RDMA device.
type Info struct {
	Name string
}

// Devices fails: no verbs in this build.
func Devices() ([]Info, error) { return nil, errNotBuilt }

// OpenDevice fails: no verbs in this build.
func OpenDevice(string, ...nprdma.DeviceOption) (*nprdma.Device, error) { return nil, errNotBuilt }
