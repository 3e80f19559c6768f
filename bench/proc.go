package bench

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// MemStatus is the resident memory of a process from /proc/<pid>/status.
type MemStatus struct {
	RSS int64 // VmRSS: resident now, bytes
	HWM int64 // VmHWM: peak resident since start (or the last reset), bytes
}

// ReadMemStatus reads VmRSS and VmHWM of pid (0 means this process).
func ReadMemStatus(pid int) (MemStatus, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return MemStatus{}, fmt.Errorf("memory status of pid %d: %w", pid, err)
	}
	ms := MemStatus{RSS: meminfoBytes(b, "VmRSS"), HWM: meminfoBytes(b, "VmHWM")}
	if ms.RSS == 0 && ms.HWM == 0 {
		// Kernel threads and zombies have no Vm* lines.
		return ms, fmt.Errorf("memory status of pid %d: no VmRSS/VmHWM in %s", pid, path)
	}
	return ms, nil
}

// RSSSampler samples a process's VmRSS periodically and keeps the peak. The
// kernel's own VmHWM is the better peak when the whole life of the process
// is of interest; sampling bounds a phase of it.
type RSSSampler struct {
	pid  int
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	peak    int64
	last    MemStatus
	samples int
	err     error
}

// StartRSSSampler samples pid (0 = this process) every interval (50 ms if 0).
func StartRSSSampler(pid int, interval time.Duration) *RSSSampler {
	if interval <= 0 {
		interval = 50 * time.Millisecond
	}
	s := &RSSSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	s.sample()
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *RSSSampler) sample() {
	ms, err := ReadMemStatus(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.last = ms
	s.peak = max(s.peak, ms.RSS)
	s.samples++
}

// RSSReport is what an RSSSampler saw.
type RSSReport struct {
	PeakRSS int64     // highest sampled VmRSS, bytes
	Last    MemStatus // the final reading (its HWM is the kernel's peak)
	Samples int
}

// Stop ends sampling, takes a final sample and reports. The error is the
// first failed read (for example, the process exited), if no read succeeded.
func (s *RSSSampler) Stop() (RSSReport, error) {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := RSSReport{PeakRSS: s.peak, Last: s.last, Samples: s.samples}
	if s.samples == 0 {
		return r, s.err
	}
	return r, nil
}
