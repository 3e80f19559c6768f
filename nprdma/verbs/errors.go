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
	// errDevice: a completion status nprdma has no name for (its verbs name
	// follows in the queue pair's error).
	errDevice = errors.New("device error")
)
