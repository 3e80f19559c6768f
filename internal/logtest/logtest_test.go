package logtest

import (
	"strings"
	"sync"
	"testing"
)

// TestBufferKeepsConcurrentWrites: every write of every goroutine is there,
// whole (run under -race: a String while others write is no data race).
func TestBufferKeepsConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				b.Write([]byte{'a' + byte(g), '\n'})
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	for g := range 4 {
		if n := strings.Count(b.String(), string([]byte{'a' + byte(g), '\n'})); n != 100 {
			t.Errorf("goroutine %d: %d of its 100 lines", g, n)
		}
	}
}
