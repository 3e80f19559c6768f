//go:build cgo && !noverbs

package verbs

import (
	"errors"

	"github.com/nprdma/nprdma/nprdma"
)

var (
	errRemoteAccess  = nprdma.ErrRemoteAccess
	errRemoteRequest = nprdma.ErrRemoteRequest
	// errQPFatal: the device reported the queue pair unusable.
	errQPFatal = errors.New("queue pair fatal error reported by the device")
	errDevice  = nprdma.ErrDevice
)
