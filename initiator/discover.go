package initiator

import (
	"context"
	"fmt"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
)

// Discover connects to the discovery controller of the target at addr over
// the nprdma fabric with device dev and returns its Discovery log page: the
// subsystems this host may access. It is DiscoverOver with NPRDMA(dev).
func Discover(ctx context.Context, dev *nprdma.Device, addr string, opts ...Option) (nvme.DiscoveryLog, error) {
	return DiscoverOver(ctx, NPRDMA(dev), addr, opts...)
}

// DiscoverOver reads the Discovery log page of the discovery controller at
// addr over transport t (NVMe/TCP discovery controllers listen on port
// 8009 by convention, and nvmet and nprdma-target also on their I/O ports).
func DiscoverOver(ctx context.Context, t Transport, addr string, opts ...Option) (nvme.DiscoveryLog, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nvme.DiscoveryLog{}, err
	}
	c, err := newController(t, addr, nvme.DiscoveryNQN, cfg)
	if err != nil {
		return nvme.DiscoveryLog{}, err
	}
	defer c.b.close()
	s, err := c.connectAdmin(ctx, nvme.DiscoveryNQN, 0, nvme.NPControllerRef{})
	if err != nil {
		return nvme.DiscoveryLog{}, err
	}
	defer s.close(ctx, false)
	if s.ident.CNTRLTYPE != nvme.ControllerTypeDiscovery {
		return nvme.DiscoveryLog{}, fmt.Errorf("initiator: %s is not a discovery controller (type %d)", addr, s.ident.CNTRLTYPE)
	}
	// Header first to learn NUMREC, then the whole log (libnvme does the
	// same, and compares the generation to catch a change in between).
	for attempt := 0; attempt < 3; attempt++ {
		head, err := getLog(ctx, s, nvme.LogDiscovery, 0, nvme.DiscoveryLogHeaderSize)
		if err != nil {
			return nvme.DiscoveryLog{}, err
		}
		gen, n, err := nvme.ParseDiscoveryLogHeader(head)
		if err != nil {
			return nvme.DiscoveryLog{}, err
		}
		if n > nvme.MaxDiscoveryLogEntries {
			return nvme.DiscoveryLog{}, fmt.Errorf("initiator: discovery log of %s announces %d entries", addr, n)
		}
		size := nvme.DiscoveryLogSize(int(n))
		full := make([]byte, 0, size)
		for off := 0; off < size; {
			k := min(size-off, s.maxXfer)
			part, err := getLog(ctx, s, nvme.LogDiscovery, uint64(off), k)
			if err != nil {
				return nvme.DiscoveryLog{}, err
			}
			full = append(full, part...)
			off += k
		}
		l, err := nvme.ParseDiscoveryLog(full)
		if err != nil {
			return nvme.DiscoveryLog{}, fmt.Errorf("initiator: discovery log of %s: %w", addr, err)
		}
		if l.GenCtr == gen {
			return l, nil
		}
	}
	return nvme.DiscoveryLog{}, fmt.Errorf("initiator: discovery log of %s kept changing", addr)
}

func getLog(ctx context.Context, s *session, lid nvme.LogPageID, off uint64, n int) ([]byte, error) {
	cmd, err := nvme.GetLogPageCommand(lid, 0, off, uint32(n), nvme.NullSGL())
	if err != nil {
		return nil, err
	}
	buf := make([]byte, n)
	if _, err := s.admin.Submit(ctx, cmd, buf); err != nil {
		return nil, fmt.Errorf("initiator: get log page %#x [%d, +%d): %w", uint8(lid), off, n, err)
	}
	return buf, nil
}
