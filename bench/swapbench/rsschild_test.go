package swapbench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	RunRSSChildIfAsked() // the test binary is MeasureRSSInChild's child too
	os.Exit(m.Run())
}

// The child measures itself, not the parent: its PID is another, and what
// it reports comes back intact.
func TestMeasureRSSInChild(t *testing.T) {
	var child int
	res, err := MeasureRSSInChild(context.Background(), filepath.Join(t.TempDir(), "rss"), 16<<20, 5, time.Second,
		func(pid int) { child = pid })
	if err != nil {
		t.Fatal(err)
	}
	if child == 0 || child == os.Getpid() {
		t.Fatalf("measured in process %d (the test is %d)", child, os.Getpid())
	}
	if res.BudgetBytes != 16<<20 || res.LimitBytes != 16<<20+16<<20/10+64<<20 {
		t.Fatalf("budget %d, limit %d: the child's parameters did not arrive", res.BudgetBytes, res.LimitBytes)
	}
	if res.BaselineBytes <= 0 || res.PeakRSSBytes < res.BaselineBytes {
		t.Fatalf("baseline %d, peak %d", res.BaselineBytes, res.PeakRSSBytes)
	}
	if !raceEnabled && !res.Within() {
		t.Fatalf("peak RSS %d exceeds the limit %d", res.PeakRSSBytes, res.LimitBytes)
	}
}

// A child that fails reports its error, not a parse error.
func TestMeasureRSSInChildReportsFailure(t *testing.T) {
	_, err := MeasureRSSInChild(context.Background(), filepath.Join(t.TempDir(), "no", "such", "dir", "rss"), 16<<20, 5,
		time.Second, nil)
	if err == nil {
		t.Fatal("a region over a file in a missing directory was measured")
	}
	t.Log(err)
}
