package tcp

import (
	"fmt"

	"github.com/nprdma/nprdma/nvme"
)

// CapsuleCmd carries a 64-byte command (SQE) after the common header, and
// in-capsule data up to the queue's limit at PDO (SGL1 0x01, data block
// with offset 0); CapsuleResp carries the 16-byte completion (CQE).

// ParseCapsuleCmd decodes the command of a CapsuleCmd header (as
// Reader.Next returns it).
func ParseCapsuleCmd(b []byte) (nvme.Command, error) {
	var c nvme.Command
	if len(b) < CapsuleCmdHeaderSize || PDUType(b[0]) != TypeCapsuleCmd {
		return c, fmt.Errorf("nvme/tcp: not a CapsuleCmd header (%d bytes)", len(b))
	}
	err := c.Unmarshal(b[CommonHeaderSize:CapsuleCmdHeaderSize])
	return c, err
}

// ParseCapsuleResp decodes the completion of a CapsuleResp header.
func ParseCapsuleResp(b []byte) (nvme.Completion, error) {
	var c nvme.Completion
	if len(b) < CapsuleRespHeaderSize || PDUType(b[0]) != TypeCapsuleResp {
		return c, fmt.Errorf("nvme/tcp: not a CapsuleResp header (%d bytes)", len(b))
	}
	err := c.Unmarshal(b[CommonHeaderSize:CapsuleRespHeaderSize])
	return c, err
}

// InCapsuleLimit is the in-capsule data a queue accepts with command c:
// queueICD (the queue's limit: FabricsInCapsuleData on the admin queue,
// the IOCCSZ-derived limit on I/O queues) and never less than
// FabricsInCapsuleData for a Fabrics command, as Linux sends Connect's data
// in the capsule on every queue.
func InCapsuleLimit(c *nvme.Command, queueICD int) int {
	if c.IsFabrics() {
		return max(queueICD, FabricsInCapsuleData)
	}
	return queueICD
}
