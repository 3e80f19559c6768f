package csi

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nprdma/nprdma/internal/caps"
)

var mountCap = &csipb.VolumeCapability{
	AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// TestVolumesGoWhereTheRoomIs: each new volume goes to the target with the
// most available capacity; a sparse volume counts whole against its
// target's, so the second goes to the other target. GetCapacity reports
// what the targets have left; a volume none can hold is ResourceExhausted.
func TestVolumesGoWhereTheRoomIs(t *testing.T) {
	r := newRig(t, false)
	c := controller{d: r.driver}
	ctx := context.Background()
	var targets []string
	for _, name := range []string{"first", "second"} {
		resp, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 30}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := parseVolumeID(resp.GetVolume().GetVolumeId())
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, v.target)
		defer c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()})
	}
	if targets[0] == targets[1] {
		t.Fatalf("both volumes on %s", targets[0])
	}
	for i, inv := range r.inventories(t) {
		if inv.ProvisionedBytes != 1<<30 || len(inv.Subsystems) != 1 {
			t.Errorf("target %d: %d bytes provisioned in %d subsystems, want one volume of 1 GiB", i+1, inv.ProvisionedBytes, len(inv.Subsystems))
		}
	}
	capacity, err := c.GetCapacity(ctx, &csipb.GetCapacityRequest{})
	if err != nil || capacity.GetAvailableCapacity() <= 0 || capacity.GetMaximumVolumeSize().GetValue() > capacity.GetAvailableCapacity() {
		t.Fatalf("capacity %v %v", capacity, err)
	}
	if _, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "huge", VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: capacity.GetMaximumVolumeSize().GetValue() + 1<<40}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a volume no target can hold: %v, want ResourceExhausted", err)
	}
}

// TestExpandWhileStaged grows a volume that a node has staged and
// published: the target's notice makes the attachment grow its loop device
// under the mounted file system, and NodeExpandVolume grows the file system
// (online, which ext4 allows only with CAP_SYS_RESOURCE, which some
// sandboxes withhold from root: without it the device's growth is checked
// and the refusal is the file system's).
func TestExpandWhileStaged(t *testing.T) {
	requireNode(t)
	r := newRig(t, true)
	c, n := controller{d: r.driver}, node{d: r.driver}
	ctx := context.Background()
	vol, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "grows", VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	pub, err := c.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: r.hostNQN, VolumeCapability: mountCap})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	os.Mkdir(staging, 0o750)
	if _, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap,
		PublishContext: pub.GetPublishContext()}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: mountCap}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("kept across the growth "), 1<<16)
	if err := os.WriteFile(filepath.Join(target, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Sync()

	exp, err := c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 96 << 20}, VolumeCapability: mountCap})
	if err != nil || exp.GetCapacityBytes() != 96<<20 || !exp.GetNodeExpansionRequired() {
		t.Fatalf("controller expansion: %+v %v", exp, err)
	}
	resp, err := n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 96 << 20}, VolumeCapability: mountCap})
	a, aerr := r.driver.attachmentNamed(ctx, volumeFor("", "grows").attachName())
	if aerr != nil || a == nil {
		t.Fatalf("attachment: %+v %v", a, aerr)
	}
	if size, err := blockDeviceSize(a.LoopDevice); err != nil || size != 96<<20 {
		t.Fatalf("%s is %d bytes after the expansion (%v)", a.LoopDevice, size, err)
	}
	if !caps.Effective(unix.CAP_SYS_RESOURCE) {
		if err == nil || !strings.Contains(err.Error(), "resize2fs") {
			t.Fatalf("NodeExpandVolume without CAP_SYS_RESOURCE: %v, want resize2fs's refusal", err)
		}
		t.Logf("the device grew; the online resize was refused here, as expected without CAP_SYS_RESOURCE: %v", err)
	} else {
		if err != nil || resp.GetCapacityBytes() != 96<<20 {
			t.Fatalf("NodeExpandVolume: %+v %v", resp, err)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(target, &fs); err != nil || int64(fs.Blocks)*fs.Bsize < 80<<20 {
			t.Fatalf("file system after NodeExpandVolume: %d bytes (%v)", int64(fs.Blocks)*fs.Bsize, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file written before the growth: %v", err)
	}

	if _, err := n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: r.hostNQN}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("target path left: %v", err)
	}
	if m, _ := mountAt(staging); m != nil {
		t.Fatalf("staging path still mounted: %+v", m)
	}
}

func TestAttachRecordsNameTheDeviceEitherWay(t *testing.T) {
	var list []attachment
	if err := decode([]byte(`[{"name":"a","loop_device":"/dev/loop1"},{"name":"b","device":"/dev/loop2"}]`), &list); err != nil {
		t.Fatal(err)
	}
	if list[0].LoopDevice != "/dev/loop1" || list[1].LoopDevice != "/dev/loop2" {
		t.Fatalf("%+v", list)
	}
}
