// Package sizes reads and prints byte sizes as the commands take them
// ("4GiB", "512MiB", "1G", "1GB"). It imports nothing of the project.
package sizes

import (
	"fmt"
	"strconv"
	"strings"
)

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"TB", 1000 * 1000 * 1000 * 1000},
	{"B", 1},
}

// Parse reads "4GiB", "512MiB", "1G" (binary), "1GB" (decimal) or a
// plain number of bytes. Units are matched in any case ("1gib", "4k"), as
// people type them; no two units differ only in case.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if n := len(t) - len(u.suffix); n >= 0 && strings.EqualFold(t[n:], u.suffix) {
			t, mult = strings.TrimSpace(t[:n]), u.mult
			break
		}
	}
	// Decimal digits and a point only: ParseFloat alone would also take
	// "NaN", "Inf" and hex floats.
	plain := t != "" && strings.Trim(t, "0123456789.") == ""
	v, err := strconv.ParseFloat(t, 64)
	if !plain || err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (KiB, MiB, GiB, TiB; K, M, G, T; KB, MB, GB, TB; any case)", s)
	}
	n := v * float64(mult)
	if n > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(n), nil
}

// Format prints bytes in the largest binary unit that keeps one
// decimal.
func Format(n int64) string {
	switch {
	case n >= 1<<40:
		return fmt.Sprintf("%.1f TiB", float64(n)/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}
