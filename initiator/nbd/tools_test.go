package nbd

// Interoperability with the stock NBD clients: nbdinfo, nbdcopy and fio's
// nbd engine (all from libnbd). Each test skips when its tool is missing.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/fiotest"
)

func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (scripts/deps.sh installs it)", name)
	}
	return path
}

// run runs a tool with a generous deadline and returns its stdout.
func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, requireTool(t, name), args...)
	cmd.Dir = t.TempDir() // tools may leave state files behind
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

func TestNbdinfoReportsSizeAndCapabilities(t *testing.T) {
	requireTool(t, "nbdinfo")
	for _, tc := range []struct {
		name string
		opts []Option
		want map[string]any
	}{
		{"read-write", []Option{WithMultiConn(true)}, map[string]any{
			"is_read_only": false, "can_flush": true, "can_fua": true, "can_trim": true, "can_zero": true,
			"can_multi_conn": true, "can_df": true, "can_cache": false, "can_fast_zero": false,
		}},
		{"single-conn", nil, map[string]any{"can_multi_conn": false, "can_flush": true}},
		{"read-only", []Option{WithReadOnly()}, map[string]any{
			"is_read_only": true, "can_flush": false, "can_fua": false, "can_trim": false, "can_zero": false,
			"can_multi_conn": true,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 3 << 20
			ts := startServer(t, blockio.NewMemory(size, testBlock), tc.opts...)
			out := run(t, "nbdinfo", "--json", URI(ts.addr, ""))
			var info struct {
				Structured bool             `json:"structured"`
				Exports    []map[string]any `json:"exports"`
			}
			if err := json.Unmarshal(out, &info); err != nil || len(info.Exports) != 1 {
				t.Fatalf("nbdinfo output %s: %v", out, err)
			}
			got := info.Exports[0]
			if !info.Structured {
				t.Error("structured replies not negotiated")
			}
			if got["export-size"] != float64(size) {
				t.Errorf("export-size %v, want %d", got["export-size"], size)
			}
			for key, want := range tc.want {
				if got[key] != want {
					t.Errorf("%s = %v, want %v", key, got[key], want)
				}
			}
			for key, want := range map[string]float64{"block_size_minimum": 1, "block_size_preferred": testBlock, "block_size_maximum": defaultMaxPayload} {
				if got[key] != want {
					t.Errorf("%s = %v, want %v", key, got[key], want)
				}
			}
		})
	}
}

func TestNbdinfoOverLoopbackTCP(t *testing.T) {
	requireTool(t, "nbdinfo")
	ln, err := ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := NewServer(blockio.NewMemory(5<<20, testBlock), WithExportName("ns1"))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), ln) }()
	defer func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if out := strings.TrimSpace(string(run(t, "nbdinfo", "--size", URI(ln.Addr(), "ns1")))); out != "5242880" {
		t.Fatalf("nbdinfo --size over TCP: %q", out)
	}
}

func TestNbdcopyRoundTrip(t *testing.T) {
	requireTool(t, "nbdcopy")
	const size = 8 << 20
	mem := blockio.NewMemory(size, testBlock)
	ts := startServer(t, mem, WithMultiConn(true))
	uri := URI(ts.addr, "")
	dir := t.TempDir()

	// Export → file: the file equals the backend's contents.
	data := pattern(size, 11)
	clear(data[1<<20 : 3<<20]) // a zero run, which nbdcopy may treat as a hole
	if _, err := mem.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.img")
	run(t, "nbdcopy", uri, out)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("nbdcopy of the export differs from the backend contents")
	}

	// File → export, over several connections, through writes and zeroing.
	src := pattern(size, 12)
	clear(src[5<<20 : 6<<20])
	in := filepath.Join(dir, "in.img")
	if err := os.WriteFile(in, src, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "nbdcopy", "--flush", in, uri)
	if !bytes.Equal(mem.Snapshot(), src) {
		t.Fatal("export differs from the file nbdcopy wrote into it")
	}
	if mem.Stats().Flushes == 0 {
		t.Fatal("nbdcopy --flush did not reach the backend's Flush")
	}
}

func TestFioVerifyThroughNBD(t *testing.T) {
	requireTool(t, "fio")
	if out, err := exec.Command("fio", "--enghelp=nbd").CombinedOutput(); err != nil || !strings.Contains(string(out), "uri") {
		t.Skipf("fio has no nbd engine: %s", out)
	}
	mem := blockio.NewMemory(32<<20, testBlock)
	ts := startServer(t, mem, WithMultiConn(true))
	// 512-byte blocks: every write is a read-modify-write of a 4 KiB
	// block, with up to 32 of them in flight on neighbouring bytes.
	for _, tc := range []struct {
		bs     string
		region int64
	}{{"4k", 8 << 20}, {"512", 2 << 20}} {
		region := tc.region
		t.Run("bs="+tc.bs, func(t *testing.T) {
			out := run(t, "fio",
				"--name=verify", "--ioengine=nbd", "--uri="+URI(ts.addr, ""),
				"--rw=randwrite", "--bs="+tc.bs, "--iodepth=32", "--numjobs=2",
				fmt.Sprintf("--size=%d", region), fmt.Sprintf("--offset_increment=%d", region),
				"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0",
				"--group_reporting", "--output-format=json")
			if err := fiotest.CheckVerify(out, 2*region); err != nil {
				t.Fatal(err)
			}
		})
	}
}
