package initiator

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
)

// TestDiscoveryPerTransport: a target on the nprdma fabric over tcp and
// over shared memory, and on NVMe/TCP. A host that discovers over the
// fabric, by either address, is pointed at both fabric ports (the unix one
// as an intra-host loop entry whose address is the socket's), each with
// its own PORTID, and connects through each; a host that discovers over
// NVMe/TCP is pointed at the NVMe/TCP port only, and connects there.
func TestDiscoveryPerTransport(t *testing.T) {
	sock := shm.Scheme + filepath.Join(t.TempDir(), "t.sock")
	tg := startTarget(t, targetSpec{prov: tcp.New(), listen: "127.0.0.1:0", alsoListen: []string{sock},
		listenTCP: "127.0.0.1:0", dir: t.TempDir(), size: 4 << 20, allowAny: true})
	host, port, err := net.SplitHostPort(tg.Addr())
	if err != nil {
		t.Fatal(err)
	}
	tcpHost, tcpPort, err := net.SplitHostPort(tg.NVMeTCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	devs := map[string]*nprdma.Device{}
	for name, p := range map[string]nprdma.Provider{"tcp": tcp.New(), "shm": shm.New()} {
		devs[name] = nprdma.NewDevice(p, nprdma.WithName("initiator"), nprdma.WithPinning(false))
		t.Cleanup(func() { devs[name].Close() })
	}
	opts := []Option{WithLogger(quiet), WithStateFile(filepath.Join(t.TempDir(), "hostid"))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	fabricWant := []nvme.DiscoveryLogEntry{
		{TRTYPE: nvme.TransportRDMA, ADRFAM: nvme.AddressIPv4, TRADDR: host, TRSVCID: port},
		{TRTYPE: nvme.TransportLoop, ADRFAM: nvme.AddressIntraHost, TRADDR: sock},
	}
	for _, c := range []struct {
		name string
		tr   Transport
		addr string
		want []nvme.DiscoveryLogEntry
	}{
		{"fabric over tcp", NPRDMA(devs["tcp"]), tg.Addr(), fabricWant},
		{"fabric over shm", NPRDMA(devs["shm"]), sock, fabricWant},
		{"NVMe/TCP", TCP(), tg.NVMeTCPAddr(), []nvme.DiscoveryLogEntry{{TRTYPE: nvme.TransportTCP, ADRFAM: nvme.AddressIPv4, TRADDR: tcpHost, TRSVCID: tcpPort}}},
	} {
		l, err := DiscoverOver(ctx, c.tr, c.addr, opts...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(l.Entries) != len(c.want) {
			t.Fatalf("%s: %d entries %+v, want %d", c.name, len(l.Entries), l.Entries, len(c.want))
		}
		ports := map[uint16]bool{}
		for i, e := range l.Entries {
			w := c.want[i]
			if e.SubNQN != testSubNQN || e.SUBTYPE != nvme.SubtypeNVM || e.TRTYPE != w.TRTYPE || e.ADRFAM != w.ADRFAM ||
				e.TRADDR != w.TRADDR || e.TRSVCID != w.TRSVCID || ports[e.PORTID] {
				t.Fatalf("%s: entry %d %+v, want %s at %s %q (type %d) on a port of its own", c.name, i, e, testSubNQN, w.TRADDR, w.TRSVCID, w.TRTYPE)
			}
			ports[e.PORTID] = true
			// Each entry leads to the subsystem: over the fabric on the
			// provider of its address.
			tr, addr := c.tr, net.JoinHostPort(e.TRADDR, e.TRSVCID)
			switch e.TRTYPE {
			case nvme.TransportLoop:
				tr, addr = NPRDMA(devs["shm"]), e.TRADDR
			case nvme.TransportRDMA:
				tr = NPRDMA(devs["tcp"])
			}
			ctl, err := ConnectOver(ctx, tr, addr, e.SubNQN, opts...)
			if err != nil {
				t.Fatalf("%s: connect to entry %d (%s): %v", c.name, i, addr, err)
			}
			if _, err := ctl.Namespace(ctx, 1); err != nil {
				t.Fatalf("%s: entry %d: %v", c.name, i, err)
			}
			ctl.Close()
		}
	}
}
