package attach

import (
	"context"
	"fmt"
	"runtime"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/nbd"
	"github.com/nprdma/nprdma/initiator/nbdkernel"
)

// nbdKernelFrontend attaches the kernel's NBD client (/dev/nbdN) to an NBD
// server in this process over socket pairs, configured over netlink. When
// the attach process dies the kernel holds the device's I/O for
// nbdkernel.DeadConnTimeout, and the next attach process of the same name
// resumes it within that time.
type nbdKernelFrontend struct{}

func (nbdKernelFrontend) Mode() Mode   { return ModeNBDKernel }
func (nbdKernelFrontend) What() string { return "the kernel's NBD client" }

func (nbdKernelFrontend) Start(ctx context.Context, b blockio.Backend, cfg Config) (Exposure, error) {
	srv, err := newNBDServer(b, cfg)
	if err != nil {
		return nil, err
	}
	conns := cfg.Queues
	if conns <= 0 {
		conns = runtime.NumCPU()
	}
	kopts := []nbdkernel.Option{nbdkernel.WithConnections(conns), nbdkernel.WithLogger(cfg.logger()),
		nbdkernel.WithBackendID(nbdBackendID(cfg.Dir, cfg.Name))}
	var dev *nbdkernel.Device
	if r := cfg.Resume; r != nil {
		index, perr := nbdkernel.ParseBlockPath(r.Device)
		if perr != nil {
			return nil, perr
		}
		if dev, err = nbdkernel.Resume(index, srv, cfg.Name, b.Size(), kopts...); err != nil {
			err = fmt.Errorf("resuming %s: %w", r.Device, err)
		}
	} else {
		dev, err = nbdkernel.Attach(srv, cfg.Name, b.Size(), kopts...)
	}
	if err != nil {
		srv.Close()
		return nil, err
	}
	return &nbdKernelExposure{dev: dev, srv: srv}, nil
}

type nbdKernelExposure struct {
	dev *nbdkernel.Device
	srv *nbd.Server
}

func (e *nbdKernelExposure) Fill(rec *Record) { rec.Device = e.dev.Path() }

// Detach refuses while the device is mounted, unless force (then it
// unmounts first), disconnects the device and closes the server.
func (e *nbdKernelExposure) Detach(force bool) error {
	if err := unmountDevice(e.dev.Path(), force); err != nil {
		return err
	}
	err := e.dev.Disconnect()
	e.srv.Close()
	return err
}

func (e *nbdKernelExposure) Failed() <-chan error { return e.dev.Failed() }

// nbdBackendID names the backend of the device of attachment name in d
// (/sys/block/nbdN/backend): how a later process knows the device is that
// attachment's. The kernel records the thread that connected a device,
// not its process, so the PID cannot tell.
func nbdBackendID(d *Dir, name string) string { return "nprdma:" + d.MountDir(name) }

// Resumable: the device is still connected for the attachment.
func (nbdKernelFrontend) Resumable(d *Dir, rec Record) bool {
	index, err := nbdkernel.ParseBlockPath(rec.Device)
	if err != nil {
		return false
	}
	backend, err := nbdkernel.Backend(index)
	return err == nil && backend == nbdBackendID(d, rec.Name)
}

// Reap disconnects the device the dead attach process left (reapDevice).
func (nbdKernelFrontend) Reap(d *Dir, rec Record, force bool) ([]string, error) {
	if rec.Device == "" {
		return nil, nil
	}
	index, err := nbdkernel.ParseBlockPath(rec.Device)
	if err != nil {
		return nil, err
	}
	return reapDevice(rec, force, "NBD", func() error { return nbdkernel.Remove(index, nbdBackendID(d, rec.Name)) })
}
