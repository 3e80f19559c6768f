package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// rawController is a host controller built from nvme/fabric directly, for
// tests that must do what the initiator never does: present keys of their
// own choosing, open queues beyond the grant, send commands above MDTS.
type rawController struct {
	pd      *nprdma.PD
	pool    *nprdma.BufferPool
	addr    string
	sub     string
	host    string
	hostID  nvme.UUID
	admin   *fabric.HostQueue
	cntlid  uint16
	icd     int
	maxCmd  int
	granted int
	io      map[uint16]*fabric.HostQueue

	closeOnce sync.Once
}

// dialRaw connects an admin queue to sub at addr as host, enables the
// controller and asks for ioQueues I/O queues (none is dialled yet). It is
// closed when the test ends.
func dialRaw(t testing.TB, dev *nprdma.Device, addr, sub, host string, ioQueues int) *rawController {
	t.Helper()
	c, err := dialRawE(dev, addr, sub, host, ioQueues)
	if err != nil {
		t.Fatalf("raw controller for %s on %s: %v", host, sub, err)
	}
	t.Cleanup(c.close)
	return c
}

func dialRawE(dev *nprdma.Device, addr, sub, host string, ioQueues int) (*rawController, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pd := dev.AllocPD()
	pool, err := nprdma.NewBufferPool(pd, fabric.HostAccess)
	if err != nil {
		return nil, err
	}
	c := &rawController{pd: pd, pool: pool, addr: addr, sub: sub, host: hostNQN(host), hostID: nvme.NewUUID(),
		io: map[uint16]*fabric.HostQueue{}}
	fail := func(err error) (*rawController, error) {
		c.close()
		return nil, err
	}
	if c.admin, err = fabric.Dial(ctx, pd, addr, fabric.QueueConfig{QID: 0, Entries: 32, CNTLID: nvme.DynamicControllerID},
		fabric.WithPool(pool)); err != nil {
		return fail(err)
	}
	if c.cntlid, err = c.connect(ctx, c.admin, nvme.DynamicControllerID); err != nil {
		return fail(err)
	}
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	if err := c.propertySet(ctx, cc); err != nil {
		return fail(err)
	}
	id, err := c.identify(ctx)
	if err != nil {
		return fail(err)
	}
	c.icd, c.maxCmd = nvme.ICDLimit(id.IOCCSZ), int(id.MAXCMD)
	if ioQueues > 0 {
		nq, err := nvme.NumberOfQueues{Submission: ioQueues, Completion: ioQueues}.Encode()
		if err != nil {
			return fail(err)
		}
		cqe, err := c.admin.Submit(ctx, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil)
		if err != nil {
			return fail(fmt.Errorf("set number of queues: %w", err))
		}
		g, err := nvme.DecodeNumberOfQueues(cqe.DW0)
		if err != nil {
			return fail(err)
		}
		c.granted = g.IOQueues()
	}
	return c, nil
}

// connect sends Fabrics Connect on q and returns the CNTLID granted.
func (c *rawController) connect(ctx context.Context, q *fabric.HostQueue, cntlid uint16) (uint16, error) {
	cd := nvme.ConnectData{HostID: c.hostID, CNTLID: cntlid, SubNQN: c.sub, HostNQN: c.host}
	data, err := cd.Marshal()
	if err != nil {
		return 0, err
	}
	cmd := nvme.ConnectCommand(nvme.ConnectParams{QID: q.QID(), SQSIZE: uint16(q.Entries() - 1)}, nvme.NullSGL())
	cqe, err := q.Submit(ctx, cmd, data)
	if err != nil {
		return 0, fmt.Errorf("connect queue %d: %w", q.QID(), err)
	}
	return nvme.DecodeConnectResponse(cqe.DW0).CNTLID, nil
}

func (c *rawController) propertySet(ctx context.Context, cc nvme.CC) error {
	cmd, err := nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))
	if err != nil {
		return err
	}
	_, err = c.admin.Submit(ctx, cmd, nil)
	return err
}

func (c *rawController) identify(ctx context.Context) (nvme.IdentifyController, error) {
	var id nvme.IdentifyController
	buf := make([]byte, nvme.IdentifySize)
	if _, err := c.admin.Submit(ctx, nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()), buf); err != nil {
		return id, fmt.Errorf("identify controller: %w", err)
	}
	return id, id.Unmarshal(buf)
}

// dialIO dials and connects I/O queue qid with entries entries.
func (c *rawController) dialIO(t testing.TB, qid uint16, entries int) *fabric.HostQueue {
	t.Helper()
	q, err := c.dialIOE(qid, entries)
	if err != nil {
		t.Fatalf("I/O queue %d: %v", qid, err)
	}
	return q
}

// dialIOE dials I/O queue qid. A queue of the same QID that just failed may
// still be in the target's books (it notices the loss asynchronously): its
// Command Sequence Error is retried for a while.
func (c *rawController) dialIOE(qid uint16, entries int) (*fabric.HostQueue, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if old := c.io[qid]; old != nil {
		old.Close()
		delete(c.io, qid)
	}
	for {
		q, err := fabric.Dial(ctx, c.pd, c.addr, fabric.QueueConfig{QID: qid, Entries: entries, InCapsuleData: c.icd, CNTLID: c.cntlid},
			fabric.WithPool(c.pool))
		if err != nil {
			return nil, err
		}
		if _, err = c.connect(ctx, q, c.cntlid); err == nil {
			c.io[qid] = q
			return q, nil
		}
		q.Close()
		if !errors.Is(err, nvme.StatusCommandSequenceError) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// region fetches namespace nsid's region descriptor.
func (c *rawController) region(ctx context.Context, nsid uint32) (nvme.RegionDescriptor, error) {
	buf := make([]byte, nvme.RegionDescriptorSize)
	if _, err := c.admin.Submit(ctx, nvme.NPGetRegionDescriptorCommand(nsid, nvme.NullSGL()), buf); err != nil {
		return nvme.RegionDescriptor{}, err
	}
	return nvme.ParseRegionDescriptor(buf)
}

func (c *rawController) mustRegion(t testing.TB, nsid uint32) nvme.RegionDescriptor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := c.region(ctx, nsid)
	if err != nil {
		t.Fatalf("region descriptor of namespace %d: %v", nsid, err)
	}
	return d
}

// readRemote reads n bytes at off of a region one-sidedly on q; the buffer
// is filled with 0xEE first, so that what the target never wrote shows.
func (c *rawController) readRemote(q *fabric.HostQueue, d nvme.RegionDescriptor, rkey uint32, off int64, n int) ([]byte, error) {
	buf, err := c.pool.Get(n)
	if err != nil {
		return nil, err
	}
	defer buf.Release()
	b := buf.Bytes()[:n]
	for i := range b {
		b[i] = 0xEE
	}
	err = q.ReadRemote(context.Background(), buf, 0, n, d.Address+uint64(off), rkey)
	return append([]byte(nil), b...), err
}

func (c *rawController) close() {
	c.closeOnce.Do(func() {
		for _, q := range c.io {
			q.Close()
		}
		if c.admin != nil {
			c.admin.Close()
		}
		c.pool.Close()
		c.pd.Close()
	})
}
