package swap

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
)

const crashChildEnv = "NPRDMA_SWAP_CRASH_CHILD"

// Pages the crash child writes: flushed, then FUA, then volatile.
const (
	crashFlushed  = 64
	crashFUA      = 8
	crashVolatile = 56
	crashPages    = crashFlushed + crashFUA + crashVolatile
)

// TestCrashChild is the child half of TestCrashKeepsFlushedData; it runs only
// when that test starts it.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("runs only as the child process of TestCrashKeepsFlushedData")
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	r, err := New(dev, WithBudget(16*PageSize))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	step := func(err error) {
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	}
	for p := 0; p < crashFlushed; p++ {
		_, err := r.WriteAt(pagePattern(p, 21), int64(p)*PageSize)
		step(err)
	}
	// A partial overwrite before the flush is part of the flushed state.
	_, err = r.WriteAt([]byte("partial overwrite"), 5*PageSize+100)
	step(err)
	step(r.Flush())
	fmt.Println("flushed")
	for p := crashFlushed; p < crashFlushed+crashFUA; p++ {
		_, err := r.WriteAtFUA(pagePattern(p, 22), int64(p)*PageSize)
		step(err)
	}
	for p := crashFlushed + crashFUA; p < crashPages; p++ {
		_, err := r.WriteAt(pagePattern(p, 23), int64(p)*PageSize)
		step(err)
	}
	fmt.Println("written")
	time.Sleep(time.Hour) // killed by the parent
}

func TestCrashKeepsFlushedData(t *testing.T) {
	path := newBackingFile(t, crashPages*PageSize)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(2 * time.Minute)
	for written := false; !written; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("child exited before writing everything")
			}
			if bytes.HasPrefix([]byte(line), []byte("error:")) {
				t.Fatalf("child: %s", line)
			}
			written = line == "written"
		case <-timeout:
			t.Fatal("child did not finish writing within 2 minutes")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	go func() {
		for range lines {
		}
	}()

	r, _ := newRegionOver(t, path, WithBudget(16*PageSize))
	for p := 0; p < crashFlushed+crashFUA; p++ {
		want := pagePattern(p, 21)
		if p == 5 {
			copy(want[100:], "partial overwrite")
		}
		if p >= crashFlushed {
			want = pagePattern(p, 22)
		}
		expectBytes(t, fmt.Sprintf("page %d after SIGKILL", p), mustRead(t, r, PageSize, int64(p)*PageSize), want)
	}
	// Volatile pages are each wholly old (zero) or wholly new.
	zero := make([]byte, PageSize)
	survived := 0
	for p := crashFlushed + crashFUA; p < crashPages; p++ {
		got := mustRead(t, r, PageSize, int64(p)*PageSize)
		switch {
		case bytes.Equal(got, pagePattern(p, 23)):
			survived++
		case !bytes.Equal(got, zero):
			t.Fatalf("volatile page %d is neither old nor new", p)
		}
	}
	t.Logf("%d of %d unflushed pages had been written back before the kill", survived, crashVolatile)
}
