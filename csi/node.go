package csi

import (
	"context"
	"errors"
	"os"
	"strconv"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type node struct {
	csipb.UnimplementedNodeServer
	d *Driver
}

// defaultFSType is the file system NodeStage makes when the CO names none.
const defaultFSType = "ext4"

// expandWait bounds how long NodeExpandVolume waits for the device to grow.
const expandWait = time.Minute

func (n node) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	// The node's ID is its host NQN: ControllerPublishVolume allows it on
	// the volume's subsystem.
	return &csipb.NodeGetInfoResponse{NodeId: n.d.cfg.hostNQN}, nil
}

func (n node) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{
			Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// where is where a staged volume's namespace is served: the publish
// context, else the volume context (both carry it).
func where(pub, vol map[string]string) (addr, nqn string, nsid uint32, err error) {
	for _, m := range []map[string]string{pub, vol} {
		if m[ctxAddress] != "" && m[ctxNQN] != "" {
			id, err := strconv.ParseUint(m[ctxNSID], 10, 32)
			if err != nil || id == 0 {
				return "", "", 0, status.Errorf(codes.InvalidArgument, "%s %q is not an NSID", ctxNSID, m[ctxNSID])
			}
			return m[ctxAddress], m[ctxNQN], uint32(id), nil
		}
	}
	return "", "", 0, status.Errorf(codes.InvalidArgument, "neither the publish context nor the volume context says where the volume is (%s, %s)", ctxAddress, ctxNQN)
}

// requested checks a node call's volume ID and path (what names the path,
// for the error) and parses the ID: one this driver never made is
// NotFound.
func requested(id, path, what string) (volume, error) {
	switch {
	case id == "":
		return volume{}, status.Error(codes.InvalidArgument, "no volume ID")
	case path == "":
		return volume{}, status.Errorf(codes.InvalidArgument, "no %s", what)
	}
	v, err := parseVolumeID(id)
	if err != nil {
		return v, status.Error(codes.NotFound, err.Error())
	}
	return v, nil
}

// staged is the volume's attachment, or NotFound / FailedPrecondition.
func (n node) staged(ctx context.Context, v volume) (*attachment, error) {
	a, err := n.d.attachmentNamed(ctx, v.attachName())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if a == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged on this node", v.id())
	}
	return a, nil
}

func (n node) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	v, err := requested(req.GetVolumeId(), req.GetStagingTargetPath(), "staging target path")
	if err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "no volume capability")
	}
	if err := checkCapabilities([]*csipb.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	addr, nqn, nsid, err := where(req.GetPublishContext(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	secrets, err := parseStageSecrets(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	defer n.d.locks.lock(v.id())()
	a, err := n.d.attachmentNamed(ctx, v.attachName())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if a != nil && (a.State != "attached" || a.NQN != nqn || a.LoopDevice == "") {
		// Dead (its controller lost, its namespace changed) or another
		// volume's leftovers: start afresh.
		n.d.cfg.log.Warn("csi: replacing an attachment that cannot serve", "volume", v.id(), "state", a.State, "reason", a.LostReason)
		if err := n.d.detach(ctx, a.Name, true); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", v.id(), err)
		}
		a = nil
	}
	if a == nil {
		if a, err = n.d.attach(ctx, v.attachName(), addr, nqn, nsid, secrets); err != nil {
			return nil, attachError(v, err)
		}
		n.d.cfg.log.Info("csi: volume attached", "volume", v.id(), "device", a.LoopDevice)
	}
	mnt := req.GetVolumeCapability().GetMount()
	if mnt == nil {
		return &csipb.NodeStageVolumeResponse{}, nil // a block volume: the device is what is published
	}
	path := req.GetStagingTargetPath()
	if ok, err := mountedFrom(path, a.LoopDevice); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if ok {
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	want := mnt.GetFsType()
	if want == "" {
		want = defaultFSType
	}
	have, err := fsType(ctx, a.LoopDevice)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	switch {
	case have == "":
		if err := makeFS(ctx, want, a.LoopDevice); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", v.id(), err)
		}
		have = want
	case have != want && mnt.GetFsType() != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s holds a %s file system, %s asked for: not reformatted", v.id(), have, want)
	}
	if err := os.MkdirAll(path, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	args := []string{"-t", have}
	if opts := mountOptions(mnt.GetMountFlags(), false); opts != "" {
		args = append(args, "-o", opts)
	}
	if _, err := run(ctx, "mount", append(args, a.LoopDevice, path)...); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", v.id(), err)
	}
	return &csipb.NodeStageVolumeResponse{}, nil
}

// mountOptions joins the CO's mount flags, read-only added.
func mountOptions(flags []string, readOnly bool) string {
	opts := ""
	for _, f := range append(flags, map[bool]string{true: "ro"}[readOnly]) {
		if f == "" {
			continue
		}
		if opts != "" {
			opts += ","
		}
		opts += f
	}
	return opts
}

func (n node) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	v, err := requested(req.GetVolumeId(), req.GetStagingTargetPath(), "staging target path")
	if err != nil {
		return nil, err
	}
	defer n.d.locks.lock(v.id())()
	if err := unmount(req.GetStagingTargetPath()); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: %v", v.id(), err)
	}
	a, err := n.d.attachmentNamed(ctx, v.attachName())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if a != nil {
		// A refusal (the device is still mounted, published somewhere)
		// leaves it attached: the CO unpublishes first.
		if err := n.d.detach(ctx, a.Name, false); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s: %v", v.id(), err)
		}
		n.d.cfg.log.Info("csi: volume detached", "volume", v.id())
	}
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

func (n node) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	v, err := requested(req.GetVolumeId(), req.GetTargetPath(), "target path")
	switch {
	case status.Code(err) == codes.InvalidArgument:
		return nil, err
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "no volume capability")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "no staging target path: the volume is staged first")
	case err != nil:
		return nil, err
	}
	if err := checkCapabilities([]*csipb.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	defer n.d.locks.lock(v.id())()
	a, err := n.staged(ctx, v)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v", status.Convert(err).Message())
	}
	target := req.GetTargetPath()
	src := req.GetStagingTargetPath()
	if req.GetVolumeCapability().GetBlock() != nil {
		src = a.LoopDevice
		if ok, err := holds(target, a.LoopDevice); err == nil && ok {
			return &csipb.NodePublishVolumeResponse{}, nil
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f.Close()
	} else {
		if ok, err := mountedFrom(target, a.LoopDevice); err == nil && ok {
			return &csipb.NodePublishVolumeResponse{}, nil
		}
		if ok, err := mountedFrom(src, a.LoopDevice); err != nil || !ok {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not mounted at its staging path %s", v.id(), src)
		}
		if err := os.MkdirAll(target, 0o750); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind mount %s on %s: %v", src, target, err)
	}
	if req.GetReadonly() {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			unix.Unmount(target, 0)
			return nil, status.Errorf(codes.Internal, "read-only remount of %s: %v", target, err)
		}
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

func (n node) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	v, err := requested(req.GetVolumeId(), req.GetTargetPath(), "target path")
	switch {
	case status.Code(err) == codes.InvalidArgument:
		return nil, err
	case err == nil:
		defer n.d.locks.lock(v.id())()
	}
	if err := unmount(req.GetTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(req.GetTargetPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

func (n node) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	v, err := requested(req.GetVolumeId(), req.GetVolumePath(), "volume path")
	if err != nil {
		return nil, err
	}
	a, err := n.staged(ctx, v)
	if err != nil {
		return nil, err
	}
	path := req.GetVolumePath()
	if ok, err := holds(path, a.LoopDevice); err != nil || !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s is not at %s", v.id(), path)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		size, err := blockDeviceSize(path)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{{Unit: csipb.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	bs := fs.Bsize
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs, Used: int64(fs.Blocks-fs.Bfree) * bs},
		{Unit: csipb.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
	}}, nil
}

func (n node) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	v, err := requested(req.GetVolumeId(), req.GetVolumePath(), "volume path")
	if err != nil {
		return nil, err
	}
	defer n.d.locks.lock(v.id())()
	a, err := n.staged(ctx, v)
	if err != nil {
		return nil, err
	}
	path := req.GetVolumePath()
	m, err := mountAt(path)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	rdev, err := devNumber(a.LoopDevice)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if m == nil || m.Dev() != rdev {
		return nil, status.Errorf(codes.NotFound, "volume %s is not mounted at %s", v.id(), path)
	}
	wctx, cancel := context.WithTimeout(ctx, expandWait)
	defer cancel()
	size, err := waitDeviceSize(wctx, a.LoopDevice, req.GetCapacityRange().GetRequiredBytes())
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: %v", v.id(), err)
	}
	if req.GetVolumeCapability().GetBlock() == nil && m.FSType != "" {
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFBLK {
			if err := growFS(ctx, m.FSType, a.LoopDevice, path); err != nil {
				return nil, status.Errorf(codes.Internal, "volume %s: %v", v.id(), err)
			}
		}
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
