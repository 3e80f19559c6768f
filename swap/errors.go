package swap

import (
	"errors"
	"fmt"
)

// Errors returned by a Region, wrapped in *Error. Test with errors.Is; errors
// from the backing device stay reachable too (errors.Is(err,
// blockdev.ErrInjected), errors.As(err, **blockdev.Error)).
var (
	ErrClosed     = errors.New("region is closed")
	ErrOutOfRange = errors.New("range beyond the end of the region")
	ErrNoMemory   = errors.New("no page can be evicted to make room")
)

// Error describes a failed region operation on pages [Page, Page+Pages) of
// the region over Path.
type Error struct {
	Op    string // "read", "write", "fault-in", "writeback", "flush", "trim", ...
	Path  string
	Page  int
	Pages int
	Err   error
}

func (e *Error) Error() string {
	if e.Pages <= 0 {
		return fmt.Sprintf("swap %s %s: %v", e.Op, e.Path, e.Err)
	}
	return fmt.Sprintf("swap %s %s pages [%d, +%d) (offset %d): %v",
		e.Op, e.Path, e.Page, e.Pages, int64(e.Page)*PageSize, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

func (r *Region) errorf(op string, page, pages int, err error) error {
	return &Error{Op: op, Path: r.path, Page: page, Pages: pages, Err: err}
}
