package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nprdma/nprdma/target/manage"
)

// DefaultName is the driver's name (GetPluginInfo; the StorageClass's
// provisioner).
const DefaultName = "csi.nprdma.io"

// Driver is the CSI plugin: identity always, the controller service with
// targets, the node service with an initiator.
type Driver struct {
	cfg     config
	targets *targets // nil: no controller service
	locks   keyedMutex
}

type config struct {
	name, version string
	targets       []Target
	controller    bool
	node          bool
	initiator     string
	initArgs      []string
	runDir        string
	hostNQN       string
	log           *slog.Logger
}

// Option configures New.
type Option func(*config)

// WithName sets the driver's name (default DefaultName).
func WithName(n string) Option { return func(c *config) { c.name = n } }

// WithVersion sets the version GetPluginInfo reports (default "dev").
func WithVersion(v string) Option { return func(c *config) { c.version = v } }

// WithController serves the controller service over these targets (default:
// not served).
func WithController(targets []Target) Option {
	return func(c *config) { c.controller, c.targets = true, targets }
}

// WithNode serves the node service as host hostNQN (its node ID), attaching
// with the nprdma-initiator binary at initiator, given args before its
// command (--hostid-file, --provider, ...), its attachments' records in
// runDir (default: not served).
func WithNode(hostNQN, initiator, runDir string, args ...string) Option {
	return func(c *config) {
		c.node, c.hostNQN, c.initiator, c.runDir, c.initArgs = true, hostNQN, initiator, runDir, args
	}
}

// WithLogger sets where the driver logs (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// New makes a driver.
func New(opts ...Option) (*Driver, error) {
	cfg := config{name: DefaultName, version: "dev", log: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.controller && !cfg.node {
		return nil, errors.New("csi: neither the controller nor the node service")
	}
	d := &Driver{cfg: cfg}
	if cfg.controller {
		if len(cfg.targets) == 0 {
			return nil, errors.New("csi: the controller service needs at least one target")
		}
		ts, err := newTargets(cfg.targets)
		if err != nil {
			return nil, fmt.Errorf("csi: %w", err)
		}
		d.targets = ts
	}
	if cfg.node {
		if cfg.hostNQN == "" || cfg.initiator == "" || cfg.runDir == "" {
			return nil, errors.New("csi: the node service needs a host NQN, the nprdma-initiator binary and a run directory")
		}
		// Secrets a plugin that died in the middle of an attach left behind.
		if err := os.RemoveAll(d.secretsDir()); err != nil {
			return nil, fmt.Errorf("csi: %w", err)
		}
	}
	return d, nil
}

// Serve serves the driver on endpoint ("unix:///path", "unix:/path" or a
// path; a socket left by a dead process is replaced) until ctx ends.
func (d *Driver) Serve(ctx context.Context, endpoint string) error {
	path := strings.TrimPrefix(strings.TrimPrefix(endpoint, "unix://"), "unix:")
	if path == "" {
		return fmt.Errorf("csi: endpoint %q: want a unix socket", endpoint)
	}
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("csi: %w", err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	d.Register(srv)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	d.cfg.log.Info("csi: serving", "endpoint", path, "controller", d.cfg.controller, "node", d.cfg.node)
	return srv.Serve(ln)
}

// Register registers the driver's services on srv.
func (d *Driver) Register(srv *grpc.Server) {
	csipb.RegisterIdentityServer(srv, identity{d: d})
	if d.cfg.controller {
		csipb.RegisterControllerServer(srv, controller{d: d})
	}
	if d.cfg.node {
		csipb.RegisterNodeServer(srv, node{d: d})
	}
}

// logCalls logs every call: its request (secrets redacted) at debug, and
// its error.
func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if d.cfg.log.Enabled(ctx, slog.LevelDebug) {
		d.cfg.log.Debug("csi: request", "method", info.FullMethod, "request", redacted(req))
	}
	resp, err := h(ctx, req)
	if err != nil {
		d.cfg.log.Warn("csi: call failed", "method", info.FullMethod, "err", err)
	} else {
		d.cfg.log.Debug("csi: call", "method", info.FullMethod)
	}
	return resp, err
}

// keyedMutex serializes the operations on one volume: the CO may retry a
// call while the first is still running.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*sync.Mutex{}
	}
	l := k.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		k.locks[key] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// grpcError maps a management API error to its gRPC status.
func grpcError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...) + ": " + err.Error()
	switch {
	case status.Code(err) != codes.Unknown:
		return err
	case errors.Is(err, manage.ErrNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, manage.ErrExists):
		return status.Error(codes.AlreadyExists, msg)
	case errors.Is(err, manage.ErrInUse):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, manage.ErrNoCapacity):
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, manage.ErrInvalid):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	}
	return status.Error(codes.Internal, msg)
}
