package verbs_test

import (
	"strings"
	"testing"

	"github.com/nprdma/nprdma/internal/guesttest"
	"github.com/nprdma/nprdma/lab"
)

// TestGuestVerbs runs this package's tests in the guest lab, on Soft-RoCE
// (rxe over eth0, the guest's own 10.0.2.15).
func TestGuestVerbs(t *testing.T) {
	t.Parallel()
	lab.Require(t)
	bin := guesttest.TestBinary(t, "./nprdma/verbs")
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"rdma_rxe", "rdma_ucm"},
		Env:     map[string]string{"BIN": bin},
		Script: `step rxe
rxe_up
cp "$BIN" /dev/shm/verbs.test
step test
cd /dev/shm
NPRDMA_VERBS_ADDR=10.0.2.15 ./verbs.test -test.v -test.skip '^TestGuest' -test.timeout 3m
`,
	})
	if !strings.Contains(res.Output, "\nPASS\n") {
		t.Fatalf("no PASS from the tests in the guest:\n%s", res.Output)
	}
}
