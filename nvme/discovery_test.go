package nvme

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func discoverySeedLog() DiscoveryLog {
	return DiscoveryLog{GenCtr: 7, Entries: []DiscoveryLogEntry{
		{TRTYPE: TransportRDMA, ADRFAM: AddressIPv4, SUBTYPE: SubtypeNVM, TREQ: TREQSecureChannelNotRequired,
			PORTID: 1, CNTLID: DynamicControllerID, ASQSZ: 32, TRSVCID: "4420", SubNQN: "nqn.2026-11.io.nprdma:disk0",
			TRADDR: "127.0.0.1", TSAS: RDMATSAS()},
		{TRTYPE: TransportLoop, ADRFAM: AddressIntraHost, SUBTYPE: SubtypeNVM, CNTLID: DynamicControllerID,
			ASQSZ: 32, SubNQN: "nqn.2026-11.io.nprdma:disk1", TRADDR: "loop-3"},
	}}
}

func discoverySeeds() [][]byte {
	l := discoverySeedLog()
	full := must(l.Marshal())
	empty := must((&DiscoveryLog{GenCtr: 1}).Marshal())
	huge := bytes.Clone(empty)
	le.PutUint64(huge[8:], 1<<40) // NUMREC far beyond the bytes
	short := full[:DiscoveryLogHeaderSize+DiscoveryLogEntrySize+10]
	return [][]byte{full, empty, huge, short, full[:16]}
}

func TestDiscoveryLogRoundTrip(t *testing.T) {
	l := discoverySeedLog()
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != DiscoveryLogSize(2) {
		t.Fatalf("size %d, want %d", len(b), DiscoveryLogSize(2))
	}
	// Offsets the specification fixes.
	e := b[DiscoveryLogHeaderSize:]
	if e[0] != TransportRDMA || e[1] != AddressIPv4 || e[2] != SubtypeNVM || e[3] != 2 ||
		le.Uint16(e[6:]) != 0xffff || le.Uint16(e[8:]) != 32 || string(e[32:36]) != "4420" ||
		string(e[256:283]) != "nqn.2026-11.io.nprdma:disk0" || string(e[512:521]) != "127.0.0.1" || e[768] != 1 || e[770] != 1 {
		t.Fatalf("entry fields not at their offsets")
	}
	if g, n, err := ParseDiscoveryLogHeader(b[:16]); err != nil || g != 7 || n != 2 {
		t.Fatalf("header: %d %d %v", g, n, err)
	}
	got, err := ParseDiscoveryLog(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, l) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, l)
	}
}

func TestDiscoveryLogRefusesBadInput(t *testing.T) {
	seeds := discoverySeeds()
	for i, b := range seeds[2:] {
		if _, err := ParseDiscoveryLog(b); err == nil {
			t.Fatalf("seed %d: accepted", i+2)
		}
	}
	if _, err := (&DiscoveryLog{Entries: []DiscoveryLogEntry{{TRSVCID: string(make([]byte, 33))}}}).Marshal(); err == nil {
		t.Fatal("a 33-byte TRSVCID was accepted")
	}
}

// FuzzDiscoveryLog: ParseDiscoveryLog never panics nor allocates beyond its
// bound; what it accepts marshals back to a log it parses identically.
func FuzzDiscoveryLog(f *testing.F) {
	for _, s := range discoverySeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseDiscoveryLogHeader(b)
		l, err := ParseDiscoveryLog(b)
		if err != nil {
			return
		}
		again, err := l.Marshal()
		if err != nil {
			t.Fatalf("accepted log does not marshal: %v", err)
		}
		l2, err := ParseDiscoveryLog(again)
		if err != nil || !reflect.DeepEqual(l, l2) {
			t.Fatalf("reparse differs: %v", err)
		}
	})
}

// TestWriteDiscoveryFuzzSeeds writes testdata/fuzz/FuzzDiscoveryLog when
// NPRDMA_WRITE_FUZZ_SEEDS=1, else checks the corpus is committed.
func TestWriteDiscoveryFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDiscoveryLog")
	seeds := discoverySeeds()
	if os.Getenv("NPRDMA_WRITE_FUZZ_SEEDS") != "1" {
		files, err := os.ReadDir(dir)
		if err != nil || len(files) < len(seeds) {
			t.Fatalf("%s: %d committed seeds, want %d (%v); run with NPRDMA_WRITE_FUZZ_SEEDS=1", dir, len(files), len(seeds), err)
		}
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seeds {
		data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
