package e2ebench

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/nprdma/nprdma/initiator/nbd"
)

// nbdRead connects to an NBD server at network/addr and reads len(p) bytes
// at off from its default export with initiator/nbd's client: the handshake,
// one READ, a polite disconnect. The startup experiment times nbdkit's first
// served read with it the way it times the target's; spawning nbdinfo or fio
// per poll would add their own start-up to the figure.
func nbdRead(ctx context.Context, network, addr string, p []byte, off uint64) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	ex, err := nbd.Handshake(conn, "")
	if err != nil {
		return fmt.Errorf("nbd %s: %w", addr, err)
	}
	if off+uint64(len(p)) > ex.Size {
		return fmt.Errorf("nbd %s: read [%d, +%d) beyond the export's %d bytes", addr, off, len(p), ex.Size)
	}
	if err := nbd.ReadAt(conn, p, off); err != nil {
		return fmt.Errorf("nbd %s: %w", addr, err)
	}
	nbd.Disconnect(conn)
	return nil
}
