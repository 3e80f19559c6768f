package mountinfo

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParse: Parse never panics, and what it accepts it reads back the same
// after writing it out again in the kernel's format (so every field is
// unescaped exactly once and no field shifts). The seeds are in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Fuzz(func(t *testing.T, data []byte) {
		mounts, err := Parse(strings.NewReader(string(data)))
		if err != nil {
			return
		}
		for _, m := range mounts {
			if m.MountPoint == "" || m.FSType == "" || m.ID < 0 || m.ParentID < 0 {
				t.Fatalf("accepted an entry without a mount point or type, or with a negative ID: %+v", m)
			}
		}
		again, err := Parse(strings.NewReader(format(mounts)))
		if err != nil {
			t.Fatalf("the table written out again does not parse: %v\n%q", err, format(mounts))
		}
		if !slices.Equal(again, mounts) {
			t.Fatalf("round trip changed the table:\n%+v\n%+v", mounts, again)
		}
	})
}
