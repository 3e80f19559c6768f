package fiotest

import (
	"strings"
	"testing"
)

func TestCheckVerify(t *testing.T) {
	const ok = `note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version": "fio-3.33", "jobs": [{"jobname": "v", "error": 0,
  "read": {"io_bytes": 1048576}, "write": {"io_bytes": 1048576}}]}`
	if err := CheckVerify([]byte(ok), 1<<20); err != nil {
		t.Fatalf("a clean verify: %v", err)
	}
	for _, tc := range []struct{ name, out, want string }{
		{"short read", strings.Replace(ok, `"read": {"io_bytes": 1048576}`, `"read": {"io_bytes": 4096}`, 1), "verified 4096"},
		{"error", strings.Replace(ok, `"error": 0`, `"error": 84`, 1), "error 84"},
		{"two groups", `{"jobs": [{}, {}]}`, "2 job groups"},
		{"no JSON", "fio: failed to open", "no JSON"},
		{"bad JSON", `{"jobs": [`, "fio output"},
	} {
		err := CheckVerify([]byte(tc.out), 1<<20)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
