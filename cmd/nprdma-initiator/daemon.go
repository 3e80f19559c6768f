package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/urfave/cli/v2"
)

// attach --daemon re-executes this program without --daemon, detached from
// the terminal (its own session, output to RUN-DIR/NAME.log), and waits
// until the child says it is attached by writing its record to a pipe
// (descriptor 3, named in envDaemonReadyFD). A child that fails closes the
// pipe without a word, and its log says why.
const (
	envDaemonReadyFD = "NPRDMA_ATTACH_READY_FD"
	envDaemonLog     = "NPRDMA_ATTACH_LOG"
	// daemonStartTimeout bounds the wait for the child: connecting takes at
	// most 30 s, a FUSE mount and a loop device a few more.
	daemonStartTimeout = 2 * time.Minute
)

func startDaemon(cc *cli.Context, req attachRequest) error {
	if old, err := req.dir.Load(req.name); err == nil && old.Process().Alive() {
		return &attach.ExistsError{Record: old}
	}
	if req.reason != "" {
		fmt.Fprintf(cc.App.ErrWriter, "nprdma-initiator: %s\n", req.reason)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--daemon: finding this program: %w", err)
	}
	logPath := req.dir.LogPath(req.name)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("--daemon: %w", err)
	}
	logStart, _ := logFile.Seek(0, io.SeekEnd)
	ready, readyW, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return err
	}
	defer ready.Close()
	cmd := exec.Command(exe, daemonArgs(cc, req)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{readyW} // descriptor 3
	cmd.Env = append(append(os.Environ(), envDaemonReadyFD+"=3", envDaemonLog+"="+logPath), daemonSecretEnv(cc)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	err = cmd.Start()
	readyW.Close()
	logFile.Close()
	if err != nil {
		return fmt.Errorf("--daemon: starting %s: %w", exe, err)
	}
	// Reap the child if it fails; if it lives on, this goroutine simply
	// ends with our process.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	line := make(chan []byte, 1)
	go func() {
		b, _ := bufio.NewReader(ready).ReadBytes('\n')
		line <- b
	}()
	var b []byte
	select {
	case b = <-line:
	case <-time.After(daemonStartTimeout):
		cmd.Process.Signal(syscall.SIGTERM)
		return fmt.Errorf("attach %s: not attached after %v; sent it SIGTERM (pid %d); its log is %s", req.name, daemonStartTimeout, cmd.Process.Pid, logPath)
	}
	var rec attach.Record
	if len(b) == 0 || json.Unmarshal(b, &rec) != nil {
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
		out := logTail(logPath, logStart)
		if logStart == 0 {
			os.Remove(logPath) // its content is in the error
		}
		return fmt.Errorf("attach %s failed:\n%s", req.name, out)
	}
	if cc.Bool("json") {
		fmt.Fprintf(cc.App.Writer, "%s", b)
		return nil
	}
	fmt.Fprintln(cc.App.Writer, sentence(rec))
	fmt.Fprintf(cc.App.ErrWriter, "nprdma-initiator: running in the background as pid %d (log %s); stop it with: nprdma-initiator detach %s\n",
		rec.PID, logPath, rec.Name)
	return nil
}

// daemonArgs are the arguments of the child: the flags given to us, with
// --daemon dropped and the resolved name, mode and run directory made
// explicit (so the child cannot resolve them differently).
func daemonArgs(cc *cli.Context, req attachRequest) []string {
	var args []string
	set := func(f cli.Flag) {
		name := f.Names()[0]
		if !cc.IsSet(name) || name == "dhchap-secret" || name == "dhchap-ctrl-secret" {
			return // secrets go in the environment (daemonSecretEnv)
		}
		v := fmt.Sprint(cc.Value(name))
		if name == "socket" || name == "hostid-file" || strings.HasSuffix(name, "secret-file") {
			// The child runs in /, so that it keeps no directory busy.
			if abs, err := filepath.Abs(v); err == nil {
				v = abs
			}
		}
		args = append(args, "--"+name+"="+v)
	}
	for _, f := range cc.App.Flags {
		set(f)
	}
	args = append(args, "attach")
	for _, f := range cc.Command.Flags {
		switch f.Names()[0] {
		case "daemon", "name", "mode", "run-dir":
			continue
		}
		set(f)
	}
	return append(args, "--name="+req.name, "--mode="+string(req.mode), "--run-dir="+req.dir.Root())
}

// logTail returns what the child wrote to the log since offset (at most the
// last 4 KiB), or says where the log is.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no output: " + err.Error() + ")"
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<30))
	if err != nil || len(b) == 0 {
		return "(no output; see " + path + ")"
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimRight(string(b), "\n")
}

// markReadyFDCloseOnExec keeps the readiness pipe of a daemon child from
// leaking into programs it runs (which would hold the parent's wait open).
func markReadyFDCloseOnExec() {
	if os.Getenv(envDaemonReadyFD) == "3" {
		syscall.CloseOnExec(3)
	}
}
