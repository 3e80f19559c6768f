package attachguest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/lab"
)

// fioBytes is what each mode's fio job writes and verifies: 2 jobs of 2 MiB.
const fioBytes = 4 << 20

// TestGuestKernelBlockDevices runs testdata/kernel-block-devices.sh in one
// guest (kernel 6.12, with ublk_drv and nbd), then judges fio's JSON and
// what else the script left in $LAB_OUT; each failed check fails its step.
// The target serves a 64 MiB namespace with a 16 MiB budget (4x) on the
// guest's loopback, metrics on loopback too. For each kernel mode, one
// attachment after another under one name:
//
//  1. attach: fio random writes then verified reads (2 jobs at QD 32),
//     blkdiscard reaching Dataset Management (the target's counter moves);
//  2. mkfs.ext4, mount, copy files, sync, fstrim reaching Dataset
//     Management; detach refused while mounted, naming the mount point;
//  3. another file synced, then kill -9 of the attach process: list shows
//     the attachment orphaned; attach again resumes the device under the
//     mounted file system (its I/O waited), and every file reads back;
//  4. unmount, e2fsck -fn clean; kill -9 again, then detach removes the
//     device the dead process left;
//  5. attach afresh (ublk: --mode auto, which must choose ublk), mount, the
//     files read back (flushed data survived both kills); detach --force
//     while mounted unmounts and detaches;
//  6. nothing left: no device, no attach process, no socket, no record.

func TestGuestKernelBlockDevices(t *testing.T) {
	lab.Require(t)
	for _, tool := range []string{"fio", "mkfs.ext4", "e2fsck", "blkdiscard", "fstrim"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s on this machine: the guest runs it from here", tool)
		}
	}
	script, err := os.ReadFile("testdata/kernel-block-devices.sh")
	if err != nil {
		t.Fatal(err)
	}
	bin := buildCommands(t)
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"ublk_drv", "nbd"},
		Env:     map[string]string{"BIN": bin},
		Timeout: 5 * time.Minute,
		Script:  string(script),
	})
	for _, mode := range []string{"ublk", "nbd-kernel"} {
		read := func(name string) string {
			b, err := os.ReadFile(filepath.Join(res.Dir, mode+"-"+name))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		if err := fiotest.CheckVerify([]byte(read("fio.json")), fioBytes); err != nil {
			t.Errorf("%s: fio: %v", mode, err)
		}
		t.Logf("%s: Dataset Management commands around blkdiscard %s, around fstrim %s", mode,
			strings.TrimSpace(read("blkdiscard")), strings.TrimSpace(read("fstrim")))
	}
	auto, err := os.ReadFile(filepath.Join(res.Dir, "ublk-attach3.err"))
	if err != nil || !strings.Contains(string(auto), "auto chose ublk") {
		t.Errorf("attach --mode auto in the guest does not say it chose ublk: %q, %v", auto, err)
	}
	for _, s := range res.Steps {
		t.Logf("step %-60s %v", s.Name, s.Duration.Round(10*time.Millisecond))
	}
}

// buildCommands builds nprdma-target and nprdma-initiator into a directory
// the guest sees at the same path (the lab shares this machine's files).
func buildCommands(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to build nprdma-target and nprdma-initiator")
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir, "github.com/nprdma/nprdma/cmd/nprdma-target", "github.com/nprdma/nprdma/cmd/nprdma-initiator")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}
