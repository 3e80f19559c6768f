package manage

import (
	"errors"
	"fmt"
	"syscall"
)

// The kinds of refusal, found with errors.Is in the target's errors and in
// a client's. Each travels as a JSON-RPC error code: the negative errno
// SPDK would use.
var (
	ErrExists     = errors.New("exists already")
	ErrNotFound   = errors.New("does not exist")
	ErrInUse      = errors.New("in use")
	ErrNoCapacity = errors.New("not enough capacity")
	ErrInvalid    = errors.New("invalid request")
	// ErrConfigured: the object comes from the target's configuration
	// (flags or config file), which would bring it back at the next start:
	// change it there.
	ErrConfigured = errors.New("owned by the configuration")
	// ErrMetadataStore: the target's metadata store failed; no change can
	// be recorded until the target restarts on a working one.
	ErrMetadataStore = errors.New("metadata store failed")
	// ErrUnauthorized: a TCP request without the right token.
	ErrUnauthorized = errors.New("unauthorized")
)

// JSON-RPC 2.0's own error codes.
const (
	CodeParseError     = -32700 // the body is not JSON
	CodeInvalidRequest = -32600 // not a JSON-RPC 2.0 request
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602 // params missing, of the wrong type, or with unknown fields
	CodeInternal       = -32603
	CodeUnauthorized   = -32001 // with HTTP 401
)

// kinds maps each kind to its code and name (the error's data.kind).
var kinds = []struct {
	err  error
	code int
	name string
}{
	{ErrMetadataStore, -int(syscall.EIO), "metadata-store"},
	{ErrExists, -int(syscall.EEXIST), "exists"},
	{ErrNotFound, -int(syscall.ENOENT), "not-found"},
	{ErrInUse, -int(syscall.EBUSY), "in-use"},
	{ErrNoCapacity, -int(syscall.ENOSPC), "no-capacity"},
	{ErrInvalid, -int(syscall.EINVAL), "invalid"},
	{ErrConfigured, -int(syscall.EPERM), "configured"},
	{ErrUnauthorized, CodeUnauthorized, "unauthorized"},
}

// Error is a JSON-RPC error object, as received by a client or sent by the
// server. errors.Is matches it against the kinds above by its code.
type Error struct {
	Code    int        `json:"code"`
	Message string     `json:"message"`
	Data    *ErrorData `json:"data,omitempty"`
}

// ErrorData says which kind of refusal an error is, by name.
type ErrorData struct {
	Kind string `json:"kind"`
}

func (e *Error) Error() string { return e.Message }

// Is matches the kind the code stands for.
func (e *Error) Is(target error) bool {
	for _, k := range kinds {
		if k.err == target {
			return e.Code == k.code
		}
	}
	return false
}

// ErrorFor is the JSON-RPC error of err: the code of the first kind it
// wraps (checked in the order above), else CodeInternal; the message is
// err's.
func ErrorFor(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return &Error{Code: k.code, Message: err.Error(), Data: &ErrorData{Kind: k.name}}
		}
	}
	return &Error{Code: CodeInternal, Message: err.Error()}
}

// Errorf builds an error of a JSON-RPC code of its own (parse error,
// invalid request, ...).
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
