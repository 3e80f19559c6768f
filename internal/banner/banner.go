// Package banner is the two lines nprdma-target prints on standard error once
// it serves: written by the target, read by its tests and by the bench that
// start it, so that their format is defined once.
//
//	nprdma-target: serving <namespaces> over <provider> on <addr>, regions <mode>, previous run: <how it ended>
//	nprdma-target: connect with: nprdma-initiator discover --target <addr>
package banner

import (
	"fmt"
	"strings"
)

const (
	// Serving starts the first line.
	Serving = "nprdma-target: serving "
	// Connect precedes the address hosts connect to on the second line.
	Connect = "nprdma-target: connect with: nprdma-initiator discover --target "
)

// PreviousRun precedes, on the first line, how the previous run with the
// same data directory ended.
const PreviousRun = "previous run: "

// Lines formats the two lines, each ending in a newline.
func Lines(namespaces, provider, addr, regions, previousRun string) string {
	return fmt.Sprintf("%s%s over %s on %s, regions %s, %s%s\n%s%s\n",
		Serving, namespaces, provider, addr, regions, PreviousRun, previousRun, Connect, addr)
}

// IsServing reports whether line is (or contains) the first line.
func IsServing(line string) bool { return strings.Contains(line, Serving) }

// Addr returns the address hosts connect to, from a line that is (or
// contains) the second line.
func Addr(line string) (string, bool) {
	i := strings.Index(line, Connect)
	if i < 0 {
		return "", false
	}
	addr := strings.TrimSpace(line[i+len(Connect):])
	return addr, addr != ""
}
