package attach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/nbd"
)

// nbdFrontend serves the backend over NBD on a unix socket (and optionally
// a loopback TCP port), for userspace NBD clients.
type nbdFrontend struct{}

func (nbdFrontend) Mode() Mode   { return ModeNBD }
func (nbdFrontend) What() string { return "an NBD socket, no block device" }

func (nbdFrontend) Start(ctx context.Context, b blockio.Backend, cfg Config) (Exposure, error) {
	srv, err := newNBDServer(b, cfg)
	if err != nil {
		return nil, err
	}
	socket := cfg.Socket
	if socket == "" {
		socket = cfg.Dir.SocketPath(cfg.Name)
	}
	ln, err := nbd.ListenUnix(socket)
	if err != nil {
		return nil, err
	}
	e := &nbdExposure{srv: srv, failed: make(chan error, 1), name: cfg.Name, unix: ln}
	if cfg.TCP != "" {
		if e.tcp, err = nbd.ListenTCP(cfg.TCP); err != nil {
			ln.Close()
			return nil, fmt.Errorf("--tcp: %w", err)
		}
	}
	listeners := []net.Listener{e.unix}
	if e.tcp != nil {
		listeners = append(listeners, e.tcp)
	}
	for _, l := range listeners {
		e.serving.Add(1)
		go func() {
			defer e.serving.Done()
			err := srv.Serve(context.Background(), l)
			if err == nil || errors.Is(err, nbd.ErrServerClosed) {
				err = errors.New("NBD server stopped")
			}
			select {
			case e.failed <- err:
			default:
			}
		}()
	}
	return e, nil
}

// newNBDServer is the NBD server of both NBD modes: the export is named
// after the attachment.
func newNBDServer(b blockio.Backend, cfg Config) (*nbd.Server, error) {
	opts := []nbd.Option{nbd.WithExportName(cfg.Name), nbd.WithDescription(cfg.Description),
		// One Flush covers every connection's writes: they all go to the
		// one backend.
		nbd.WithMultiConn(true), nbd.WithLogger(cfg.logger())}
	if cfg.Registerer != nil {
		opts = append(opts, nbd.WithRegisterer(cfg.Registerer))
	}
	return nbd.NewServer(b, opts...)
}

type nbdExposure struct {
	srv     *nbd.Server
	name    string
	unix    *net.UnixListener
	tcp     *net.TCPListener
	serving sync.WaitGroup
	failed  chan error
	closed  bool
}

func (e *nbdExposure) Fill(rec *Record) {
	rec.Socket, rec.URI = e.unix.Addr().String(), nbd.URI(e.unix.Addr(), e.name)
	if e.tcp != nil {
		rec.TCPAddr, rec.TCPURI = e.tcp.Addr().String(), nbd.URI(e.tcp.Addr(), e.name)
	}
}

// Detach closes the server gracefully: requests in flight complete, a
// client still connected is warned of in the log and closed after a flush,
// the socket file goes. It never refuses.
func (e *nbdExposure) Detach(bool) error {
	if e.closed {
		return nil
	}
	e.closed = true
	e.srv.Close()
	e.serving.Wait()
	return nil
}

// Failed yields why a Serve call ended before Detach.
func (e *nbdExposure) Failed() <-chan error { return e.failed }

// Reap removes the socket file if nothing listens on it.
func (nbdFrontend) Reap(d *Dir, rec Record, force bool) ([]string, error) {
	if rec.Socket == "" {
		return nil, nil
	}
	removed, err := removeStaleSocket(rec.Socket)
	if err != nil || !removed {
		return nil, err
	}
	return []string{"removed socket " + rec.Socket}, nil
}

// removeStaleSocket removes path if it is a unix socket nobody listens on.
func removeStaleSocket(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Mode().Type() != os.ModeSocket {
		return false, fmt.Errorf("%s is not a socket; left alone", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return false, fmt.Errorf("socket %s: another process listens on it; left alone", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return false, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return true, nil
}
