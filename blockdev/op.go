package blockdev

import (
	"math/bits"
	"strings"
)

// Op is a kind of Device operation. Values combine into sets with |, so a
// fault rule can cover several kinds at once (OpWrite|OpWriteFUA).
type Op uint8

const (
	OpRead Op = 1 << iota
	OpWrite
	OpWriteFUA
	OpFlush
	OpDiscard

	// OpAnyWrite is every operation that changes data.
	OpAnyWrite = OpWrite | OpWriteFUA | OpDiscard
	// OpAll is every kind of operation.
	OpAll = OpRead | OpWrite | OpWriteFUA | OpFlush | OpDiscard
)

// numOps is the number of single kinds; index(op) is below it.
const numOps = 5

// opNames are the names Error.Op and the metrics' op label use.
var opNames = [numOps]string{"read", "write", "write-fua", "flush", "discard"}

// String names a single kind as in Error.Op ("write-fua") and a set as its
// kinds joined by "|".
func (o Op) String() string {
	if o == 0 {
		return "none"
	}
	var parts []string
	for i := range numOps {
		if o&(1<<i) != 0 {
			parts = append(parts, opNames[i])
		}
	}
	if o&^OpAll != 0 {
		parts = append(parts, "unknown")
	}
	return strings.Join(parts, "|")
}

// index is the position of a single kind in per-kind arrays.
func (o Op) index() int { return bits.TrailingZeros8(uint8(o)) }

// hasRange reports whether operations of this single kind cover a byte range
// (every kind but flush).
func (o Op) hasRange() bool { return o != OpFlush }
