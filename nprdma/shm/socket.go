package shm

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// sendMsg writes one message with the given descriptors.
func sendMsg(c *net.UnixConn, b []byte, files ...*os.File) error {
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fd, err := rawFD(f)
			if err != nil {
				return err
			}
			fds[i] = fd
		}
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("shm: short write of a socket message (%d of %d bytes)", n, len(b))
	}
	return nil
}

// recvMsg reads one message and the descriptors that came with it (at most
// maxFDs are accepted: a message with more is an error, and every
// descriptor received is closed).
func recvMsg(c *net.UnixConn, buf []byte, maxFDs int) ([]byte, []*os.File, error) {
	oob := make([]byte, unix.CmsgSpace(4*(maxFDs+1)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	files, perr := parseRights(oob[:oobn])
	if err == nil && n == 0 && oobn == 0 {
		err = errEOF
	}
	if err == nil {
		err = perr
	}
	if err == nil && (flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(files) > maxFDs) {
		err = fmt.Errorf("%w: message of more than %d bytes or %d descriptors", errMessage, len(buf), maxFDs)
	}
	if err != nil {
		closeFiles(files)
		return nil, nil, err
	}
	return buf[:n], files, nil
}

var errEOF = fmt.Errorf("shm: peer closed its socket")

// parseRights turns SCM_RIGHTS control messages into files (the runtime
// receives them close-on-exec).
func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	var bad error
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = err
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "nprdma-shm-peer"))
		}
	}
	if bad != nil {
		closeFiles(files)
		return nil, bad
	}
	return files, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// rawFD is f's descriptor, read without File.Fd, which would put it in
// blocking mode (a doorbell must stay in the network poller). The caller
// keeps f open while it uses the number.
func rawFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return -1, err
	}
	return fd, nil
}
