package banner

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestLinesRoundTrip(t *testing.T) {
	out := Lines("nqn.x/1 (4 GiB)", "tcp", "127.0.0.1:4420", "unpinned (NP-RDMA)", "shut down cleanly")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", out)
	}
	if !IsServing(lines[0]) || IsServing(lines[1]) {
		t.Fatalf("IsServing: %q", lines)
	}
	if _, ok := Addr(lines[0]); ok {
		t.Fatalf("Addr found an address in the serving line %q", lines[0])
	}
	// A log prefix in front does not hide the address.
	if addr, ok := Addr("2026/11/21 " + lines[1]); !ok || addr != "127.0.0.1:4420" {
		t.Fatalf("Addr = %q, %v", addr, ok)
	}
	if _, ok := Addr(Connect + "  "); ok {
		t.Fatal("Addr accepted an empty address")
	}
}

func TestWatch(t *testing.T) {
	pr, pw := io.Pipe()
	w := Watch(pr)
	io.WriteString(pw, "starting\n")
	select {
	case <-w.Ready():
		t.Fatal("ready before the address line")
	case <-time.After(10 * time.Millisecond):
	}
	io.WriteString(pw, Lines("ns", "tcp", "127.0.0.1:9", "unpinned", "shut down cleanly"))
	<-w.Ready()
	if w.Addr() != "127.0.0.1:9" || !strings.Contains(w.Banner(), ", previous run: shut down cleanly") {
		t.Fatalf("addr %q banner %q", w.Addr(), w.Banner())
	}
	io.WriteString(pw, "later\n")
	pw.Close()
	<-w.Done()
	if log := w.Log(); !strings.HasPrefix(log, "starting\n") || !strings.HasSuffix(log, "later\n") || strings.Count(log, "\n") != 4 {
		t.Fatalf("log %q", log)
	}
}

func TestNVMeTCPLine(t *testing.T) {
	for _, c := range []struct{ addr, disc, want string }{
		{"127.0.0.1:4420", "127.0.0.1:8009", "nprdma-target: NVMe/TCP on 127.0.0.1:4420 (discovery on 127.0.0.1:8009): nvme discover -t tcp -a 127.0.0.1 -s 8009\n"},
		{"10.0.2.15:4421", "", "nprdma-target: NVMe/TCP on 10.0.2.15:4421: nvme discover -t tcp -a 10.0.2.15 -s 4421\n"},
	} {
		line := NVMeTCPLine(c.addr, c.disc)
		if line != c.want {
			t.Errorf("NVMeTCPLine(%q, %q) = %q, want %q", c.addr, c.disc, line, c.want)
		}
		if got, ok := NVMeTCPAddr(line); !ok || got != c.addr {
			t.Errorf("NVMeTCPAddr(%q) = %q, %v", line, got, ok)
		}
	}
	if _, ok := NVMeTCPAddr("nprdma-target: serving x"); ok {
		t.Error("an address in another line")
	}
}
