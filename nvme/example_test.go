package nvme_test

import (
	"errors"
	"fmt"

	"github.com/nprdma/nprdma/nvme"
)

// A host writes one 4 KiB block in the capsule; the controller parses the
// capsule, validates the command and answers.
func Example_writeInCapsule() {
	// Host side.
	data := make([]byte, 4096)
	cmd, err := nvme.WriteCommand(1, 7, 1, nvme.FUA, nvme.InCapsuleSGL(0, uint32(len(data))))
	if err != nil {
		panic(err)
	}
	cmd.CID = 12
	capsule := nvme.MarshalCapsule(&cmd, data)

	// Controller side: an I/O queue accepting 8 KiB of in-capsule data, a
	// namespace of 1000 blocks of 4 KiB, 128 KiB maximum transfer.
	got, icd, err := nvme.ParseCapsule(capsule, nvme.ICDLimit(nvme.IOCCSZFor(8192)))
	if err == nil {
		var rw nvme.BlockIO
		rw, err = got.CheckReadWrite(1000, 4096, 128<<10)
		fmt.Printf("write blocks [%d, +%d) FUA %v, %d bytes in the capsule\n", rw.SLBA, rw.Blocks(), rw.FUA, len(icd))
	}
	cqe := nvme.Completion{CID: got.CID, SQID: 1}
	cqe.SetError(err)
	fmt.Println(cqe.Status)
	// Output:
	// write blocks [7, +1) FUA true, 4096 bytes in the capsule
	// success (SCT 0 SC 0x00)
}

// A read beyond the namespace comes back to the host as a status it can
// test with errors.Is.
func Example_statusError() {
	sgl, _ := nvme.KeyedSGL(0x7f0000000000, 8192, 0x1234)
	cmd, _ := nvme.ReadCommand(1, 999, 2, 0, sgl)

	// Controller.
	_, err := cmd.CheckReadWrite(1000, 4096, 0)
	cqe := nvme.Completion{CID: cmd.CID}
	cqe.SetError(err)
	wire := cqe.Marshal()

	// Host.
	var back nvme.Completion
	_ = back.Unmarshal(wire)
	err = back.Err()
	fmt.Println(errors.Is(err, nvme.StatusLBAOutOfRange), back.Status.DNR())
	fmt.Printf("status field 0x%04x: %v\n", uint16(back.Status), back.Status)
	// Output:
	// true true
	// status field 0x8100: LBA out of range (SCT 0 SC 0x80, DNR)
}
