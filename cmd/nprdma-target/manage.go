package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/target"
	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

// The management API's endpoints (docs/target.md §11).
const (
	manageSocketName = "manage.sock"
	volumeDirName    = "volumes"
	// noSocket turns the unix socket off.
	noSocket = "none"
)

func manageCLIFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "manage-socket", Usage: "unix socket of the management API (nprdma-target ctl): created mode 0600, so only this user (and root) may change the target; \"none\": no socket (default: DATA-DIR/" + manageSocketName + ")"},
		&cli.StringFlag{Name: "manage-listen", Usage: "also serve the management API on this TCP address (e.g. 127.0.0.1:4421), for the CSI controller on another machine; needs --manage-token-file (default: off)"},
		&cli.StringFlag{Name: "manage-token-file", Usage: "file holding the token that every request on --manage-listen must carry (Authorization: Bearer); owner-only (mode 0600 or 0400), at least 16 bytes; a request without it gets HTTP 401"},
		&cli.StringFlag{Name: "volume-dir", Usage: "directory where namespaces created through the management API without a backing of their own get a sparse file (default: DATA-DIR/" + volumeDirName + ")"},
		&cli.BoolFlag{Name: "no-default-namespace", Usage: "without --backing or --config, serve no namespace at start instead of the default file (namespaces then come from the management API)"},
	}
}

// manageSetup is the management API's endpoints as the flags give them.
type manageSetup struct {
	socket    string // "" : none
	listen    string
	token     string
	volumeDir string
}

func manageFromFlags(cc *cli.Context, dataDir string) (manageSetup, error) {
	m := manageSetup{socket: cc.String("manage-socket"), listen: cc.String("manage-listen"), volumeDir: cc.String("volume-dir")}
	switch m.socket {
	case "":
		m.socket = filepath.Join(dataDir, manageSocketName)
	case noSocket:
		m.socket = ""
	}
	if m.volumeDir == "" {
		m.volumeDir = filepath.Join(dataDir, volumeDirName)
	}
	switch tf := cc.String("manage-token-file"); {
	case m.listen != "" && tf == "":
		return m, errors.New("--manage-listen needs --manage-token-file: an unauthenticated management endpoint on TCP would let anyone on the network change the target")
	case tf != "":
		if m.listen == "" {
			return m, errors.New("--manage-token-file without --manage-listen: the unix socket is guarded by its file mode, not by a token")
		}
		tok, err := manage.ReadTokenFile(tf)
		if err != nil {
			return m, fmt.Errorf("--manage-token-file: %w", err)
		}
		m.token = tok
	}
	return m, nil
}

// serve starts the management API on its endpoints and returns what stops
// it (at once: a management call in flight finishes on its own).
func (m manageSetup) serve(tg *target.Target, log *slog.Logger) (stop func(), err error) {
	var srvs []*http.Server
	stop = func() {
		for _, s := range srvs {
			s.Close()
		}
		if m.socket != "" {
			os.Remove(m.socket)
		}
	}
	start := func(ln net.Listener, token string) {
		s := &http.Server{Handler: tg.ManageHandler(token), ReadHeaderTimeout: 10 * time.Second}
		srvs = append(srvs, s)
		go s.Serve(ln)
	}
	if m.socket != "" {
		ln, err := listenUnix(m.socket)
		if err != nil {
			return stop, fmt.Errorf("--manage-socket: %w", err)
		}
		start(ln, "")
		log.Info("management API", "socket", m.socket)
	}
	if m.listen != "" {
		ln, err := net.Listen("tcp", m.listen)
		if err != nil {
			stop()
			return func() {}, fmt.Errorf("--manage-listen: %w", err)
		}
		start(ln, m.token)
		log.Info("management API", "tcp", ln.Addr().String(), "token", "required")
	}
	return stop, nil
}

// listenUnix listens on a unix socket at path, mode 0600. A socket file
// left by a process that is gone is replaced; one that answers is in use.
func listenUnix(path string) (net.Listener, error) {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use by another process (another target with the same --data-dir?)", path)
		}
		os.Remove(path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	old := syscall.Umask(0o077) // no moment with the socket open to others
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // stop removes it, once
	return ln, os.Chmod(path, 0o600)
}
