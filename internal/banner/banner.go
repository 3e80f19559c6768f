// Package banner is the two lines nprdma-target prints on standard error once
// it serves: written by the target, read by its tests and by the bench that
// start it, so that their format is defined once.
//
//	nprdma-target: serving <namespaces> over <provider> on <addr>, regions <mode>, previous run: <how it ended>
//	nprdma-target: connect with: nprdma-initiator discover --target <addr>
//
// and, when it serves NVMe/TCP hosts too, a third:
//
//	nprdma-target: NVMe/TCP on <addr> (discovery on <addr>): nvme discover -t tcp -a <host> -s <port>
package banner

import (
	"fmt"
	"net"
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

// NVMeTCP precedes the NVMe/TCP port's address on the third line.
const NVMeTCP = "nprdma-target: NVMe/TCP on "

// NVMeTCPLine formats the third line: the NVMe/TCP port at addr and the
// discovery port at disc ("" when there is none: hosts discover on addr).
func NVMeTCPLine(addr, disc string) string {
	where, d := "", addr
	if disc != "" {
		where, d = " (discovery on "+disc+")", disc
	}
	host, port, err := net.SplitHostPort(d)
	if err != nil {
		host, port = d, ""
	}
	return fmt.Sprintf("%s%s%s: nvme discover -t tcp -a %s -s %s\n", NVMeTCP, addr, where, host, port)
}

// NVMeTCPAddr returns the NVMe/TCP port's address from a line that is (or
// contains) the third line.
func NVMeTCPAddr(line string) (string, bool) {
	i := strings.Index(line, NVMeTCP)
	if i < 0 {
		return "", false
	}
	addr, _, _ := strings.Cut(line[i+len(NVMeTCP):], " ")
	addr = strings.TrimSuffix(addr, ":") // "host:port: nvme discover …"
	return addr, addr != ""
}
