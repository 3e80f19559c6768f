package attachbench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/lab"
)

// TestAttachModesSmoke runs the experiment end to end at toy size (one
// round, 2 s jobs) in a guest: every figure is there with a finite ratio.
// It boots a guest and runs 16 fio jobs: NPRDMA_LONG=1 only.
func TestAttachModesSmoke(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") == "" {
		t.Skip("boots a guest and runs the experiment: NPRDMA_LONG=1")
	}
	lab.Require(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	env := &bench.Env{Mode: bench.ModeQuick, OutDir: t.TempDir(), ScratchDir: t.TempDir(), Tools: &bench.Tools{}}
	exp, err := Measure(context.Background(), env, root, Config{Rounds: 1, Runtime: 2 * time.Second, Ramp: time.Second, Size: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(exp.Figures) != 6 {
		t.Fatalf("%d figures, want 6 (QD1 and QD32 of three modes against FUSE+loop)", len(exp.Figures))
	}
	for _, f := range exp.Figures {
		if f.Value <= 0 || f.BaselineValue <= 0 || math.IsNaN(f.Ratio) || !strings.Contains(f.Notes, "TCG") {
			t.Errorf("figure %+v", f)
		}
		t.Logf("%s: %.0f %s vs %.0f (%.2fx)", f.Name, f.Value, f.Unit, f.BaselineValue, f.Ratio)
	}
}
