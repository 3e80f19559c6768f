package np_test

import (
	"strings"
	"testing"
)

// TestCheckPagePartDetects shows that the stress test's checker can fail:
// torn, stale, misplaced and never-written content is each refused, from a
// whole page and from parts of one.
func TestCheckPagePartDetects(t *testing.T) {
	const page = 7
	v3 := versionedPage(page, 3)
	torn := append(append([]byte(nil), versionedPage(page, 2)[:2048]...), v3[2048:]...)
	for _, tc := range []struct {
		name            string
		lo              int
		data            []byte
		floor, started  uint64
		wantErr         string // "" = accepted
		wantVersionless bool
	}{
		{name: "whole page", data: v3, floor: 2, started: 3},
		{name: "middle part", lo: 1000, data: v3[1000:1800], floor: 3, started: 4},
		{name: "version word only", lo: 8, data: v3[8:16], floor: 3, started: 3},
		{name: "header only", data: v3[:8], floor: 3, started: 3, wantVersionless: true},
		{name: "zero page never written", data: make([]byte, 4096)},
		{name: "torn", data: torn, floor: 2, started: 3, wantErr: "torn"},
		{name: "torn part", lo: 2000, data: torn[2000:2100], floor: 2, started: 3, wantErr: "torn"},
		{name: "stale", data: v3, floor: 4, started: 4, wantErr: "older"},
		{name: "zero after a completed write", data: make([]byte, 4096), floor: 1, started: 1, wantErr: "older"},
		{name: "never written version", data: v3, floor: 1, started: 2, wantErr: "never written"},
		{name: "other page", data: versionedPage(page+1, 3)[16:], lo: 16, floor: 3, started: 3, wantErr: "not page 7"},
		{name: "other page's header", data: versionedPage(page+1, 3)[:8], floor: 3, started: 3, wantErr: "header"},
		{name: "word moved", lo: 16, data: v3[24:32], floor: 3, started: 3, wantErr: "not page 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			versioned, err := checkPagePart(page, tc.lo, tc.data, tc.floor, tc.started)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			case err == nil && versioned == tc.wantVersionless:
				t.Fatalf("versioned = %v", versioned)
			}
		})
	}
}
