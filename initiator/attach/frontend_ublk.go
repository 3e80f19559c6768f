package attach

import (
	"context"
	"fmt"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/ublk"
)

// ublkFrontend serves the backend as a ublk block device (/dev/ublkbN),
// created with user recovery: when the attach process dies the device
// stays, its I/O waits, and the next attach process of the same name
// resumes it.
type ublkFrontend struct{}

func (ublkFrontend) Mode() Mode   { return ModeUBLK }
func (ublkFrontend) What() string { return "a ublk block device" }

func (ublkFrontend) Start(ctx context.Context, b blockio.Backend, cfg Config) (Exposure, error) {
	opts := []ublk.Option{ublk.WithLogger(cfg.logger())}
	if cfg.Queues > 0 {
		opts = append(opts, ublk.WithQueues(cfg.Queues))
	}
	if cfg.QueueDepth > 0 {
		opts = append(opts, ublk.WithQueueDepth(cfg.QueueDepth))
	}
	if r := cfg.Resume; r != nil {
		id, err := ublk.ParseBlockPath(r.Device)
		if err != nil {
			return nil, err
		}
		dev, err := ublk.Resume(id, b, opts...)
		if err != nil {
			return nil, fmt.Errorf("resuming %s: %w", r.Device, err)
		}
		return &ublkExposure{dev}, nil
	}
	dev, err := ublk.Serve(b, opts...)
	if err != nil {
		return nil, err
	}
	return &ublkExposure{dev}, nil
}

type ublkExposure struct{ dev *ublk.Device }

func (e *ublkExposure) Fill(rec *Record) { rec.Device = e.dev.Path() }

// Detach refuses while the device is mounted, unless force (then it
// unmounts first), and stops and deletes the device.
func (e *ublkExposure) Detach(force bool) error {
	if err := unmountDevice(e.dev.Path(), force); err != nil {
		return err
	}
	return e.dev.Stop()
}

func (e *ublkExposure) Failed() <-chan error { return e.dev.Failed() }

// Resumable: the device of a dead attach process waits for a new server.
func (ublkFrontend) Resumable(d *Dir, rec Record) bool {
	id, err := ublk.ParseBlockPath(rec.Device)
	return err == nil && ublk.Orphaned(id, rec.PID)
}

// Reap removes the device the dead attach process left (reapDevice).
func (ublkFrontend) Reap(d *Dir, rec Record, force bool) ([]string, error) {
	if rec.Device == "" {
		return nil, nil
	}
	id, err := ublk.ParseBlockPath(rec.Device)
	if err != nil {
		return nil, err
	}
	return reapDevice(rec, force, "ublk", func() error { return ublk.Remove(id, rec.PID) })
}
