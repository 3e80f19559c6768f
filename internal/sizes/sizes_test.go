package sizes

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "1GiB": 1 << 30, "512MiB": 512 << 20, "1.5G": 3 << 29, "2KB": 2000, "0": 0, " 8 MiB ": 8 << 20,
		// Units in any case.
		"1gib": 1 << 30, "512mib": 512 << 20, "4k": 4 << 10, "2tib": 2 << 40, "3kb": 3000, "1Gb": 1000 * 1000 * 1000, "10b": 10, "1.5 gIB": 3 << 29} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1MiB", "12XB", "1e30GiB", "NaN", "NaNGiB", "Inf", "+Inf", "0x1p30", "1e3", "1..2",
		"gib", "-1mib", "nan", "nangib", "inf", "+infk", "0x10k", "0x1p30b", "1e3k", "12xb"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
