package nbd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// ListenUnix listens on a unix socket at path, readable and writable by the
// owner only. A socket file left behind by a dead server is replaced; a
// socket somebody still listens on, or a file that is not a socket, is an
// error. The socket file is removed when the listener is closed.
func ListenUnix(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("nbd: listen on %s: file exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("nbd: listen on %s: a server is already listening there", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("nbd: listen on %s: probing the existing socket: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("nbd: remove stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("nbd: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("nbd: restrict socket %s: %w", path, err)
	}
	return ln, nil
}

// ListenTCP listens on a loopback TCP address ("127.0.0.1:10809",
// "[::1]:0", "localhost:10809"). NBD has no authentication here, so other
// addresses are refused.
func ListenTCP(addr string) (*net.TCPListener, error) {
	// Refuse before binding: a listener on all interfaces must not exist
	// even for a moment, and the error should name the address as given.
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("nbd: %w", err)
	}
	if !ta.IP.IsLoopback() {
		what := ta.IP.String()
		if ta.IP == nil || ta.IP.IsUnspecified() {
			what = "the address for all interfaces"
		}
		return nil, fmt.Errorf("nbd: listen on %s: %s is not a loopback address; NBD has no authentication", addr, what)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("nbd: %w", err)
	}
	tl := ln.(*net.TCPListener)
	if ip := tl.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		tl.Close()
		return nil, fmt.Errorf("nbd: listen on %s: %s is not a loopback address; NBD has no authentication", addr, ip)
	}
	return tl, nil
}

// URI returns the NBD URI (the libnbd form, accepted by nbdinfo, nbdcopy,
// fio --ioengine=nbd and qemu) for a listener's address and export name:
// nbd+unix:///export?socket=/path for a unix socket, nbd://host:port/export
// for TCP.
func URI(addr net.Addr, export string) string {
	switch a := addr.(type) {
	case *net.UnixAddr:
		return "nbd+unix:///" + uriEscape(export, false) + "?socket=" + uriEscape(a.Name, true)
	case *net.TCPAddr:
		return "nbd://" + a.String() + "/" + uriEscape(export, false)
	}
	return ""
}

// uriEscape percent-encodes everything but unreserved characters (and "/"
// in socket paths), so ordinary paths stay readable.
func uriEscape(s string, keepSlash bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9',
			ch == '-', ch == '.', ch == '_', ch == '~', ch == '/' && keepSlash:
			b.WriteByte(ch)
		default:
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}
