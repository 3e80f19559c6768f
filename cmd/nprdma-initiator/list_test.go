package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator/attach"
)

// A refused detach (the process goes on serving) and a failed teardown (the
// process exits, its record kept for detach to reap) read differently.
func TestListSaysRefusedOrFailed(t *testing.T) {
	now := time.Now()
	recs := []attach.Record{
		{Name: "busy", URI: "nbd+unix:///busy", DetachAttempts: 2, DetachError: "mounted at /mnt", Started: now},
		{Name: "lost", URI: "nbd+unix:///lost", DetachError: "1 write could not be flushed", Started: now},
		{Name: "fine", URI: "nbd+unix:///fine", Started: now},
	}
	var out bytes.Buffer
	printAttachments(&out, recs, now)
	lines := strings.Split(out.String(), "\n")
	want := map[string]string{
		"busy": "(detach refused: mounted at /mnt)",
		"lost": "(detach failed: 1 write could not be flushed)",
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch w, ok := want[f[0]]; {
		case ok && !strings.Contains(l, w):
			t.Errorf("%s: %q lacks %q", f[0], l, w)
		case f[0] == "fine" && strings.Contains(l, "detach"):
			t.Errorf("fine: %q speaks of a detach", l)
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v\n%s", want, out.String())
	}
}
