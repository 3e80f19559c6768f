package banner

import (
	"bufio"
	"io"
	"strings"
	"sync"
)

// Watcher reads a target's standard error as it runs: it keeps every line,
// and the serving lines' banner and address once they appear.
type Watcher struct {
	mu     sync.Mutex
	log    strings.Builder
	banner string
	addr   string
	ready  chan struct{}
	done   chan struct{}
}

// Watch reads r until it ends, on a goroutine of its own.
func Watch(r io.Reader) *Watcher {
	w := &Watcher{ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l := sc.Text()
			w.mu.Lock()
			w.log.WriteString(l + "\n")
			if IsServing(l) {
				w.banner = l
			}
			if addr, ok := Addr(l); ok && w.addr == "" {
				w.addr = addr
				close(w.ready)
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// Ready is closed once the address line was read.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Done is closed once r ended (the process closed its standard error).
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Addr is the address hosts connect to ("" before Ready).
func (w *Watcher) Addr() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addr
}

// Banner is the serving line ("" before it was printed).
func (w *Watcher) Banner() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.banner
}

// Log is every line read so far.
func (w *Watcher) Log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.String()
}
