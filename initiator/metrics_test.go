package initiator

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsMatchStats: every counter of Stats is exported with
// WithMetrics, labelled with the subsystem, and moves with the I/O done.
func TestMetricsMatchStats(t *testing.T) {
	r := newRig(t, kinds[0], targetSpec{allowAny: true})
	reg := prometheus.NewRegistry()
	c := r.connect(t, WithMetrics(reg))
	n := namespace(t, c)
	buf := make([]byte, 8*BlockSize)
	if _, err := n.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Trim(0, BlockSize); err != nil {
		t.Fatal(err)
	}
	if err := n.WriteZeroes(BlockSize, BlockSize); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	want := map[string]uint64{
		"nprdma_initiator_reads_total": s.Reads, "nprdma_initiator_reads_one_sided_total": s.ReadsOneSided,
		"nprdma_initiator_one_sided_read_ops_total": s.OneSidedReads, "nprdma_initiator_one_sided_read_pages_total": s.OneSidedPages,
		"nprdma_initiator_one_sided_read_bytes_total": s.OneSidedBytes, "nprdma_initiator_suspected_faults_total": s.SuspectedPages,
		"nprdma_initiator_fallback_reads_total": s.FallbackReads, "nprdma_initiator_fallback_pages_total": s.FallbackPages,
		"nprdma_initiator_false_positives_total": s.FalsePositives, "nprdma_initiator_minor_faults_total": s.MinorResolved,
		"nprdma_initiator_major_faults_total": s.MajorResolved, "nprdma_initiator_two_sided_reads_total": s.TwoSidedReads,
		"nprdma_initiator_writes_total": s.Writes, "nprdma_initiator_flushes_total": s.Flushes,
		"nprdma_initiator_trims_total": s.Trims, "nprdma_initiator_write_zeroes_total": s.WriteZeroes,
		"nprdma_initiator_reconnects_total": s.Reconnects,
	}
	if s.Writes != 1 || s.Flushes != 1 || s.Trims != 1 || s.WriteZeroes != 1 || s.Reads == 0 || s.OneSidedPages != 8 {
		t.Fatalf("stats after one of each: %+v", s)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				got[mf.GetName()] = m.GetCounter().GetValue()
			}
			labelled := false
			for _, l := range m.GetLabel() {
				labelled = labelled || l.GetName() == "subsystem" && l.GetValue() == testSubNQN
			}
			if !labelled {
				t.Errorf("%s: labels %v, want subsystem=%s", mf.GetName(), m.GetLabel(), testSubNQN)
			}
		}
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != float64(v) {
			t.Errorf("%s = %v (exported %v), Stats says %d", name, g, ok, v)
		}
	}
}
