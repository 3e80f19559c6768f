package csi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sort"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nprdma/nprdma/internal/sizes"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target/manage"
)

type controller struct {
	csipb.UnimplementedControllerServer
	d *Driver
}

// Publish and volume context keys: where a node finds the volume; and, in
// the volume context, the key files with which ControllerPublishVolume
// makes the node's host authenticate (paramDHCHAPKeyFile).
const (
	ctxAddress           = "nprdma.io/target-address"
	ctxNQN               = "nprdma.io/nqn"
	ctxNSID              = "nprdma.io/nsid"
	ctxDHCHAPKeyFile     = "nprdma.io/dhchap-key-file"
	ctxDHCHAPCtrlKeyFile = "nprdma.io/dhchap-ctrl-key-file"
)

// blockSize is the granularity of a volume's size.
const blockSize = 4096

// defaultVolumeSize is a volume's size when the CO asks for none.
const defaultVolumeSize = 1 << 30

// Parameters a StorageClass may give.
const (
	paramBudget = "budget" // the namespace's DRAM budget, e.g. "256MiB"
	// paramDHCHAPKeyFile is a key file on the target's machine holding the
	// host secret every node publishing the volume must authenticate with
	// (the node-stage Secret's dhchapSecret); paramDHCHAPCtrlKeyFile the
	// controller's secret, for bidirectional authentication (its
	// dhchapCtrlSecret). The target reads them (target/manage add-host).
	paramDHCHAPKeyFile     = "dhchapKeyFile"
	paramDHCHAPCtrlKeyFile = "dhchapCtrlKeyFile"
)

// keyFileContext is the volume context key of each key file parameter.
var keyFileContext = map[string]string{paramDHCHAPKeyFile: ctxDHCHAPKeyFile, paramDHCHAPCtrlKeyFile: ctxDHCHAPCtrlKeyFile}

func (c controller) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, t := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{
			Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// sizeOf is the size a capacity range asks for: required rounded up to the
// block size (defaultVolumeSize when neither bound is given), within limit.
func sizeOf(r *csipb.CapacityRange) (size, limit int64, err error) {
	req, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || limit < 0 {
		return 0, 0, status.Errorf(codes.InvalidArgument, "capacity range %v: negative", r)
	}
	switch {
	case req > 0:
		size = (req + blockSize - 1) / blockSize * blockSize
	case limit > 0:
		size = limit / blockSize * blockSize
	default:
		size = defaultVolumeSize
	}
	if limit > 0 && size > limit {
		return 0, 0, status.Errorf(codes.OutOfRange, "capacity range %v: no multiple of %d bytes fits", r, blockSize)
	}
	return size, limit, nil
}

// checkCapabilities refuses what a volume cannot do: it is one namespace
// attached on one node at a time.
func checkCapabilities(caps []*csipb.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "no volume capabilities")
	}
	for _, c := range caps {
		if c.GetBlock() == nil && c.GetMount() == nil {
			return status.Error(codes.InvalidArgument, "a volume capability without an access type")
		}
		switch m := c.GetAccessMode().GetMode(); m {
		case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
			csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
			csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
			csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		default:
			return status.Errorf(codes.InvalidArgument, "access mode %v: an nprdma volume is attached on one node at a time", m)
		}
	}
	return nil
}

// find looks for the volume called name on every target.
func (c controller) find(ctx context.Context, name string) (volume, *manage.NamespaceInfo, error) {
	var unreachable []string
	for _, in := range c.d.targets.inventories(ctx) {
		if in.err != nil {
			unreachable = append(unreachable, fmt.Sprintf("%s: %v", in.target.Name, in.err))
			continue
		}
		v := volumeFor(in.target.Name, name)
		for _, s := range in.inv.Subsystems {
			if s.NQN != v.nqn() {
				continue
			}
			for _, n := range s.Namespaces {
				if n.NSID == volumeNSID {
					return v, &n, nil
				}
			}
			return v, nil, nil // its subsystem, without the namespace: a create cut short
		}
	}
	if len(unreachable) > 0 {
		// The volume may be on a target that does not answer: creating it
		// elsewhere would make two.
		return volume{}, nil, status.Errorf(codes.Unavailable, "targets unreachable: %v", unreachable)
	}
	return volume{}, nil, nil
}

func (c controller) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume name")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources (snapshots, clones) are not supported")
	}
	size, limit, err := sizeOf(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	var budget int64
	keys := map[string]string{}
	for k, v := range req.GetParameters() {
		switch k {
		case paramBudget:
			if budget, err = sizes.Parse(v); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "parameter %s: %v", k, err)
			}
		case paramDHCHAPKeyFile, paramDHCHAPCtrlKeyFile:
			if !filepath.IsAbs(v) {
				return nil, status.Errorf(codes.InvalidArgument, "parameter %s: %q is not an absolute path (of a file on the targets' machines)", k, v)
			}
			keys[keyFileContext[k]] = v
		default:
			return nil, status.Errorf(codes.InvalidArgument, "unknown parameter %q (known: %s, %s, %s)", k, paramBudget, paramDHCHAPKeyFile, paramDHCHAPCtrlKeyFile)
		}
	}
	if keys[ctxDHCHAPCtrlKeyFile] != "" && keys[ctxDHCHAPKeyFile] == "" {
		return nil, status.Errorf(codes.InvalidArgument, "parameter %s needs %s too: DH-HMAC-CHAP authenticates the host first", paramDHCHAPCtrlKeyFile, paramDHCHAPKeyFile)
	}
	defer c.d.locks.lock("name/" + req.GetName())()

	v, existing, err := c.find(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if v.target != "" {
		t, _ := c.d.targets.byName(v.target)
		if existing != nil {
			if existing.SizeBytes < req.GetCapacityRange().GetRequiredBytes() || (limit > 0 && existing.SizeBytes > limit) {
				return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes, outside the range asked for (%v)", req.GetName(), existing.SizeBytes, req.GetCapacityRange())
			}
			return &csipb.CreateVolumeResponse{Volume: c.volumeOf(t, v, existing.SizeBytes, keys)}, nil
		}
		// Its subsystem without the namespace: finish the create there.
		return c.create(ctx, t, v, size, limit, budget, keys, false)
	}

	// A new volume: the target with the most room that can hold it.
	var fits []inventory
	for _, in := range c.d.targets.inventories(ctx) {
		if in.err == nil && in.inv.AvailableBytes >= size {
			fits = append(fits, in)
		}
	}
	if len(fits) == 0 {
		return nil, status.Errorf(codes.ResourceExhausted, "no target can hold %d bytes", size)
	}
	sort.SliceStable(fits, func(i, j int) bool { return fits[i].inv.AvailableBytes > fits[j].inv.AvailableBytes })
	var errs []error
	for _, in := range fits {
		resp, err := c.create(ctx, in.target, volumeFor(in.target.Name, req.GetName()), size, limit, budget, keys, true)
		if err == nil || status.Code(err) == codes.InvalidArgument {
			return resp, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", in.target.Name, err))
	}
	return nil, status.Errorf(codes.ResourceExhausted, "no target took the volume: %v", errors.Join(errs...))
}

// create makes volume v on target t: its subsystem (unless it exists), then
// its namespace; a failure removes the subsystem it made. keys go to the
// volume's context.
func (c controller) create(ctx context.Context, t Target, v volume, size, limit, budget int64, keys map[string]string, newSubsystem bool) (*csipb.CreateVolumeResponse, error) {
	mc, err := c.d.targets.client(t)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if newSubsystem {
		if _, err := mc.CreateSubsystem(ctx, manage.CreateSubsystemParams{NQN: v.nqn()}); err != nil && !errors.Is(err, manage.ErrExists) {
			return nil, grpcError(err, "target %s: creating subsystem %s", t.Name, v.nqn())
		}
	}
	n, err := mc.AddNamespace(ctx, manage.AddNamespaceParams{NQN: v.nqn(), Name: v.nsName(), NSID: volumeNSID,
		SizeBytes: size, BudgetBytes: budget, MaxSizeBytes: max(limit/blockSize*blockSize, 0)})
	if err != nil {
		if rerr := mc.DeleteSubsystem(ctx, manage.DeleteSubsystemParams{NQN: v.nqn()}); rerr != nil && !errors.Is(rerr, manage.ErrNotFound) {
			c.d.cfg.log.Warn("csi: removing the subsystem of a volume not created", "target", t.Name, "nqn", v.nqn(), "err", rerr)
		}
		return nil, grpcError(err, "target %s: creating the namespace of volume %s", t.Name, v.id())
	}
	c.d.cfg.log.Info("csi: volume created", "volume", v.id(), "target", t.Name, "size", n.SizeBytes, "budget", n.BudgetBytes)
	return &csipb.CreateVolumeResponse{Volume: c.volumeOf(t, v, n.SizeBytes, keys)}, nil
}

// volumeOf is volume v of size bytes on t, with the key files in keys (by
// context key) in its context.
func (c controller) volumeOf(t Target, v volume, size int64, keys map[string]string) *csipb.Volume {
	ctx := map[string]string{ctxAddress: t.Address, ctxNQN: v.nqn(), ctxNSID: strconv.Itoa(volumeNSID)}
	maps.Copy(ctx, keys)
	return &csipb.Volume{VolumeId: v.id(), CapacityBytes: size, VolumeContext: ctx}
}

// lookup resolves a volume ID to its target and client; a malformed ID or
// an unknown target is NotFound (the CO may hold IDs of a target since
// removed from the list).
func (c controller) lookup(id string) (volume, Target, *manage.Client, error) {
	if id == "" {
		return volume{}, Target{}, nil, status.Error(codes.InvalidArgument, "no volume ID")
	}
	v, err := parseVolumeID(id)
	if err != nil {
		return v, Target{}, nil, status.Error(codes.NotFound, err.Error())
	}
	t, ok := c.d.targets.byName(v.target)
	if !ok {
		return v, t, nil, status.Errorf(codes.NotFound, "volume %s: no target %q in the driver's list", id, v.target)
	}
	mc, err := c.d.targets.client(t)
	if err != nil {
		return v, t, nil, status.Error(codes.Unavailable, err.Error())
	}
	return v, t, mc, nil
}

// namespaceOf finds the volume's namespace on its target t; none is
// NotFound.
func namespaceOf(ctx context.Context, mc *manage.Client, t Target, v volume) (*manage.NamespaceInfo, error) {
	inv, err := mc.Inventory(ctx)
	if err != nil {
		return nil, grpcError(err, "volume %s", v.id())
	}
	for _, s := range inv.Subsystems {
		if s.NQN == v.nqn() {
			for _, n := range s.Namespaces {
				if n.NSID == volumeNSID {
					return &n, nil
				}
			}
		}
	}
	return nil, status.Errorf(codes.NotFound, "volume %s does not exist on target %s", v.id(), t.Name)
}

func (c controller) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	v, t, mc, err := c.lookup(req.GetVolumeId())
	if status.Code(err) == codes.NotFound {
		return &csipb.DeleteVolumeResponse{}, nil // nothing to delete
	}
	if err != nil {
		return nil, err
	}
	defer c.d.locks.lock(v.id())()
	err = mc.RemoveNamespace(ctx, manage.RemoveNamespaceParams{NQN: v.nqn(), NSID: volumeNSID})
	if err != nil && !errors.Is(err, manage.ErrNotFound) {
		return nil, grpcError(err, "target %s: deleting volume %s", t.Name, v.id())
	}
	err = mc.DeleteSubsystem(ctx, manage.DeleteSubsystemParams{NQN: v.nqn()})
	if err != nil && !errors.Is(err, manage.ErrNotFound) {
		return nil, grpcError(err, "target %s: deleting the subsystem of volume %s", t.Name, v.id())
	}
	c.d.cfg.log.Info("csi: volume deleted", "volume", v.id())
	return &csipb.DeleteVolumeResponse{}, nil
}

func (c controller) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "no volume ID")
	case req.GetNodeId() == "":
		return nil, status.Error(codes.InvalidArgument, "no node ID")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "no volume capability")
	}
	v, t, mc, err := c.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if err := checkCapabilities([]*csipb.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	if err := nvme.ValidateNQN(req.GetNodeId()); err != nil {
		// A node's ID is its host NQN (NodeGetInfo).
		return nil, status.Errorf(codes.NotFound, "node %q: not an nprdma node (its ID is its host NQN): %v", req.GetNodeId(), err)
	}
	defer c.d.locks.lock(v.id())()
	if _, err := namespaceOf(ctx, mc, t, v); err != nil {
		return nil, err
	}
	// With the volume's key files, the node's host must authenticate.
	vc := req.GetVolumeContext()
	if err := mc.AddHost(ctx, manage.HostParams{NQN: v.nqn(), Host: req.GetNodeId(),
		DHCHAPKeyFile: vc[ctxDHCHAPKeyFile], DHCHAPCtrlKeyFile: vc[ctxDHCHAPCtrlKeyFile]}); err != nil {
		return nil, grpcError(err, "target %s: publishing volume %s to %s", t.Name, v.id(), req.GetNodeId())
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		ctxAddress: t.Address, ctxNQN: v.nqn(), ctxNSID: strconv.Itoa(volumeNSID)}}, nil
}

func (c controller) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	v, t, mc, err := c.lookup(req.GetVolumeId())
	if status.Code(err) == codes.NotFound {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil // no volume: unpublished
	}
	if err != nil {
		return nil, err
	}
	defer c.d.locks.lock(v.id())()
	var hosts []string
	if req.GetNodeId() != "" {
		hosts = []string{req.GetNodeId()}
	} else {
		// From every node.
		inv, err := mc.Inventory(ctx)
		if err != nil {
			return nil, grpcError(err, "target %s", t.Name)
		}
		for _, s := range inv.Subsystems {
			if s.NQN == v.nqn() {
				hosts = s.Hosts
			}
		}
	}
	for _, h := range hosts {
		err := mc.RemoveHost(ctx, manage.HostParams{NQN: v.nqn(), Host: h})
		if err != nil && !errors.Is(err, manage.ErrNotFound) {
			return nil, grpcError(err, "target %s: unpublishing volume %s from %s", t.Name, v.id(), h)
		}
	}
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (c controller) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	v, t, mc, err := c.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no volume capabilities")
	}
	if _, err := namespaceOf(ctx, mc, t, v); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters()}}, nil
}

func (c controller) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	var total, largest int64
	for _, in := range c.d.targets.inventories(ctx) {
		if in.err != nil {
			c.d.cfg.log.Warn("csi: target not counted in the capacity", "target", in.target.Name, "err", in.err)
			continue
		}
		total += in.inv.AvailableBytes
		largest = max(largest, in.inv.AvailableBytes)
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: total, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}

func (c controller) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	v, t, mc, err := c.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "no capacity range")
	}
	size, _, err := sizeOf(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	defer c.d.locks.lock(v.id())()
	n, err := namespaceOf(ctx, mc, t, v)
	if err != nil {
		return nil, err
	}
	if size > n.SizeBytes {
		info, err := mc.ResizeNamespace(ctx, manage.ResizeNamespaceParams{NQN: v.nqn(), NSID: volumeNSID, SizeBytes: size})
		if err != nil {
			if errors.Is(err, manage.ErrNoCapacity) {
				return nil, status.Errorf(codes.ResourceExhausted, "target %s: %v", t.Name, err)
			}
			return nil, grpcError(err, "target %s: expanding volume %s", t.Name, v.id())
		}
		n = &info
	}
	block := req.GetVolumeCapability().GetBlock() != nil
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: n.SizeBytes, NodeExpansionRequired: !block}, nil
}
