package npread_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nprdma/nprdma/integration/np/npread"
)

// Each decoder either refuses its input with ErrMalformed or returns a
// value whose encoding is the input again (one encoding per message), and
// never panics. Seeds: testdata/fuzz/<name>/ (NPRDMA_WRITE_SEEDS=1 go test
// -run TestWriteSeedCorpus rewrites them) plus the f.Add ones below.

func descriptorSeeds() [][]byte {
	ok := npread.AppendDescriptor(nil, npread.Descriptor{Addr: 0x7f0000000000, Length: 1 << 40, RKey: 0xdeadbeef,
		PageSize: 4096, Magic: 0x0123456789abcdef, MaxRead: 1 << 20})
	wraps := npread.AppendDescriptor(nil, npread.Descriptor{Addr: ^uint64(0) - 4095, Length: 8192, RKey: 1,
		PageSize: 4096, Magic: 1, MaxRead: 4096})
	badPage := npread.AppendDescriptor(nil, npread.Descriptor{Addr: 4096, Length: 4096, PageSize: 4095, Magic: 1, MaxRead: 1})
	badVersion := bytes.Clone(ok)
	badVersion[4] = 2
	return [][]byte{ok, wraps, badPage, badVersion, ok[:npread.DescriptorSize-1], {}}
}

func requestSeeds() [][]byte {
	ok := npread.AppendRequest(nil, npread.Request{Tag: 7, Off: 3 << 12, Len: 4096, DestAddr: 0x7f0000001000, DestRKey: 42})
	zero := npread.AppendRequest(nil, npread.Request{Tag: 1, Len: 0})
	huge := npread.AppendRequest(nil, npread.Request{Tag: 1, Len: npread.MaxReadLimit + 1})
	reserved := bytes.Clone(ok)
	reserved[37] = 1
	return [][]byte{ok, zero, huge, reserved, append(bytes.Clone(ok), 0), ok[:8]}
}

func responseSeeds() [][]byte {
	ok := npread.AppendResponse(nil, npread.Response{Tag: 7, Status: npread.StatusOK, Len: 4096, MinorFaults: 1})
	refused := npread.AppendResponse(nil, npread.Response{Tag: 8, Status: npread.StatusOutOfRange})
	unknown := bytes.Clone(ok)
	unknown[1] = 99
	wrongOp := bytes.Clone(ok)
	wrongOp[0] = 1
	return [][]byte{ok, refused, unknown, wrongOp, ok[:31]}
}

func addSeeds(f *testing.F, seeds [][]byte) {
	for _, s := range seeds {
		f.Add(s)
	}
}

func checkDecode[T any](t *testing.T, b []byte, decode func([]byte) (T, error), encode func([]byte, T) []byte) {
	v, err := decode(b)
	if err != nil {
		if !errors.Is(err, npread.ErrMalformed) {
			t.Fatalf("error %v does not match ErrMalformed", err)
		}
		return
	}
	if again := encode(nil, v); !bytes.Equal(again, b) {
		t.Fatalf("decoded %+v re-encodes as %x, input was %x", v, again, b)
	}
}

func FuzzDecodeDescriptor(f *testing.F) {
	addSeeds(f, descriptorSeeds())
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, npread.DecodeDescriptor, npread.AppendDescriptor)
		if d, err := npread.DecodeDescriptor(b); err == nil && (d.Addr+d.Length < d.Addr || d.PageSize == 0 || d.MaxRead == 0) {
			t.Fatalf("accepted an unusable descriptor %+v", d)
		}
	})
}

func FuzzDecodeRequest(f *testing.F) {
	addSeeds(f, requestSeeds())
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, npread.DecodeRequest, npread.AppendRequest)
		if q, err := npread.DecodeRequest(b); err == nil && (q.Len == 0 || q.Len > npread.MaxReadLimit) {
			t.Fatalf("accepted a request of %d bytes", q.Len)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	addSeeds(f, responseSeeds())
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, npread.DecodeResponse, npread.AppendResponse)
	})
}

// TestDecodersRefuseSeeds pins down which seeds are valid, so that the
// corpus keeps covering both sides of every check.
func TestDecodersRefuseSeeds(t *testing.T) {
	valid := func(err error) bool { return err == nil }
	for i, s := range descriptorSeeds() {
		_, err := npread.DecodeDescriptor(s)
		if valid(err) != (i == 0) {
			t.Errorf("descriptor seed %d: %v", i, err)
		}
	}
	for i, s := range requestSeeds() {
		_, err := npread.DecodeRequest(s)
		if valid(err) != (i == 0) {
			t.Errorf("request seed %d: %v", i, err)
		}
	}
	for i, s := range responseSeeds() {
		_, err := npread.DecodeResponse(s)
		if valid(err) != (i <= 1) {
			t.Errorf("response seed %d: %v", i, err)
		}
	}
}

// TestWriteSeedCorpus regenerates the committed seed corpus
// (NPRDMA_WRITE_SEEDS=1 go test -run TestWriteSeedCorpus).
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("NPRDMA_WRITE_SEEDS") != "1" {
		t.Skip("set NPRDMA_WRITE_SEEDS=1 to rewrite testdata/fuzz")
	}
	for name, seeds := range map[string][][]byte{"FuzzDecodeDescriptor": descriptorSeeds(),
		"FuzzDecodeRequest": requestSeeds(), "FuzzDecodeResponse": responseSeeds()} {
		dir := filepath.Join("testdata", "fuzz", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s)))
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
