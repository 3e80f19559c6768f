package initiator

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nprdma/nprdma/target"
)

// TestNamespaceGrowsWithoutReconnect: the target grows a namespace while the
// initiator holds it; the Namespace Attribute Changed notice makes the
// initiator take the new size (Resized, Size) on the same session, the new
// range is written, read back (over the nprdma fabric one-sided, with a new
// region descriptor), and the old range keeps its data. Deleting the
// namespace then fails it for good without any I/O (Changed). Over every
// transport: the notice is NVMe's, NVMe/TCP's hosts get it too.
func TestNamespaceGrowsWithoutReconnect(t *testing.T) {
	for _, k := range everyTransport {
		t.Run(k.name, func(t *testing.T) {
			dir := t.TempDir()
			r := newRig(t, k, targetSpec{size: 8 << 20, budget: 8 << 20, allowAny: true,
				targetOpts: []target.Option{target.WithVolumeDir(filepath.Join(dir, "volumes"))}})
			created, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: testSubNQN, Name: "grows", Size: 4 << 20, Budget: 16 << 20})
			if err != nil {
				t.Fatal(err)
			}
			c := r.connect(t)
			n, err := c.Namespace(context.Background(), created.NSID())
			if err != nil {
				t.Fatal(err)
			}
			writePattern(t, n, 7, 256<<10)
			if err := n.Flush(); err != nil {
				t.Fatal(err)
			}
			verifyRange(t, n, 0, 4<<20, 7)
			before, err := n.RegionDescriptor(context.Background())
			if err != nil || (before == nil) != k.nvmeTCP {
				t.Fatalf("region descriptor %v %v", before, err)
			}
			cntlid := c.CNTLID()

			if _, err := r.tg.ResizeNamespace(testSubNQN, n.NSID(), 12<<20); err != nil {
				t.Fatal(err)
			}
			select {
			case <-n.Resized():
			case <-time.After(10 * time.Second):
				t.Fatal("no Resized after the target grew the namespace")
			}
			if n.Size() != 12<<20 {
				t.Fatalf("size %d after the notice", n.Size())
			}
			if c.CNTLID() != cntlid || c.Stats().Reconnects != 0 {
				t.Fatalf("the controller reconnected (cntlid %d -> %d, %d reconnects)", cntlid, c.CNTLID(), c.Stats().Reconnects)
			}
			buf := make([]byte, 8<<20)
			pattern(buf, 4<<20, 9)
			if _, err := n.WriteAt(buf, 4<<20); err != nil {
				t.Fatalf("write in the grown range: %v", err)
			}
			oneSided := c.Stats().OneSidedReads
			verifyRange(t, n, 4<<20, 8<<20, 9)
			verifyRange(t, n, 0, 4<<20, 7)
			after, err := n.RegionDescriptor(context.Background())
			switch {
			case k.nvmeTCP && (err != nil || after != nil || c.Stats().OneSidedReads != 0):
				t.Fatalf("over NVMe/TCP: region descriptor %+v %v, %d one-sided reads", after, err, c.Stats().OneSidedReads)
			case k.nvmeTCP:
			case err != nil || after == nil || after.Length != 12<<20 || after.RKey == before.RKey:
				t.Fatalf("region descriptor after the growth: %+v (before %+v) %v", after, before, err)
			case c.Stats().OneSidedReads == oneSided:
				t.Fatal("no one-sided read after the growth")
			}

			if err := r.tg.DeleteNamespace(testSubNQN, n.NSID(), true); err != nil {
				t.Fatal(err)
			}
			select {
			case <-n.Changed():
			case <-time.After(10 * time.Second):
				t.Fatal("the deleted namespace is not Changed")
			}
			if _, err := n.ReadAt(buf[:4096], 0); !errors.Is(err, ErrNamespaceChanged) {
				t.Fatalf("read of the deleted namespace: %v", err)
			}
		})
	}
}
