package target

import (
	"github.com/nprdma/nprdma/nvme"
)

// Identity of the controllers this target presents.
const (
	modelNumber      = "nprdma"
	firmwareRevision = "0.1"
	maxAERs          = 4 // AERL+1
)

// admin executes an admin command of a connected controller; on the
// receive loop (inline) only those that never wait (inlineAdmin).
func (c *controller) admin(r Request, inline bool) result {
	cmd := r.Command()
	if inline && !inlineAdmin(cmd) {
		return result{wait: true}
	}
	if cmd.IsFabrics() {
		switch cmd.FabricsType() {
		case nvme.FabricsPropertyGet:
			return c.propertyGet(cmd)
		case nvme.FabricsPropertySet:
			return c.propertySet(cmd)
		}
		return result{err: nvme.InvalidOpcode(cmd, true)}
	}
	c.mu.Lock()
	ready := c.csts.RDY
	c.mu.Unlock()
	if !ready {
		return result{err: nvme.Errorf(nvme.StatusCommandSequenceError, "controller %d not enabled (CC.EN=0)", c.id)}
	}
	switch cmd.Opcode {
	case nvme.AdminIdentify:
		return c.identify(r)
	case nvme.AdminGetLogPage:
		return c.getLogPage(r)
	case nvme.AdminSetFeatures:
		return c.setFeatures(cmd)
	case nvme.AdminGetFeatures:
		return c.getFeatures(cmd)
	case nvme.AdminKeepAlive:
		c.mu.Lock()
		c.armKeepAliveLocked()
		c.mu.Unlock()
		return result{}
	case nvme.AdminAsyncEventRequest:
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.aers) >= maxAERs {
			return result{err: nvme.Errorf(nvme.StatusAsyncEventLimitExceeded.WithDNR(), "%d async event requests outstanding", len(c.aers))}
		}
		if c.gone {
			return result{err: nvme.Errorf(nvme.StatusAbortedSQDeleted, "controller %d gone", c.id)}
		}
		if dw0, ok := c.takeNoticeLocked(); ok {
			return result{dw0: dw0}
		}
		c.aers = append(c.aers, r)
		return result{parked: true}
	case nvme.AdminAbort:
		return result{dw0: 1} // not aborted (as nvmet)
	case nvme.AdminNPGetRegionDescriptor:
		if c.discovery() || !c.port.oneSided {
			// Over NVMe/TCP: no one-sided reads; hosts read two-sided.
			return result{err: nvme.InvalidOpcode(cmd, true)}
		}
		return c.regionDescriptor(r)
	}
	return result{err: nvme.InvalidOpcode(cmd, true)}
}

func (c *controller) capValue() nvme.CAP {
	return nvme.CAP{MQES: uint16(c.t.cfg.queueDepth - 1), CQR: true, TO: 15, CSS: nvme.CSSNVM}
}

func (c *controller) propertyGet(cmd *nvme.Command) result {
	p, err := cmd.Property()
	if err != nil {
		return result{err: err}
	}
	if size := nvme.PropertySize(p.Offset); size == 0 || (size != p.Size && !(p.Offset == nvme.PropCAP && p.Size == 4)) {
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "property get of %d bytes at %#x", p.Size, p.Offset)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var v uint64
	switch p.Offset {
	case nvme.PropCAP:
		v = c.capValue().Encode()
	case nvme.PropVS:
		v = uint64(nvme.Version1_3)
	case nvme.PropCC:
		v = uint64(c.cc.Encode())
	case nvme.PropCSTS:
		v = uint64(c.csts.Encode())
	default:
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "property %#x not readable", p.Offset)}
	}
	return result{dw0: uint32(v), dw1: uint32(v >> 32)}
}

func (c *controller) propertySet(cmd *nvme.Command) result {
	p, err := cmd.Property()
	if err != nil {
		return result{err: err}
	}
	if p.Offset != nvme.PropCC || p.Size != 4 {
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "property set of %d bytes at %#x: only CC is writable", p.Size, p.Offset)}
	}
	cc := nvme.DecodeCC(uint32(p.Value))
	c.mu.Lock()
	old := c.cc
	c.cc = cc
	switch {
	case cc.EN && !old.EN:
		if err := cc.CheckEnable(); err != nil {
			c.csts.CFS = true
			c.t.log.Warn("target: controller enable refused", "cntlid", c.id, "err", err)
		} else {
			c.csts.RDY = true
			c.armKeepAliveLocked()
		}
	case !cc.EN && old.EN:
		c.mu.Unlock()
		c.reset()
		c.mu.Lock()
	}
	if cc.SHN != nvme.ShutdownNone && old.SHN == nvme.ShutdownNone {
		c.csts.SHST = nvme.ShutdownStatusOccurring
		c.mu.Unlock()
		if c.sub != nil {
			for _, n := range c.sub.Namespaces() {
				if err := n.Flush(); err != nil {
					c.t.log.Error("target: flush at controller shutdown failed", "cntlid", c.id, "nsid", n.nsid, "err", err)
				}
			}
		}
		c.mu.Lock()
		c.csts.SHST = nvme.ShutdownStatusComplete
	}
	if cc.SHN == nvme.ShutdownNone && old.SHN != nvme.ShutdownNone {
		c.csts.SHST = nvme.ShutdownStatusNormal
	}
	c.mu.Unlock()
	return result{}
}

func (c *controller) identify(r Request) result {
	cmd := r.Command()
	p := cmd.Identify()
	if err := cmd.CheckTransfer(nvme.IdentifySize, uint64(c.t.cfg.maxTransfer)); err != nil {
		return result{err: err}
	}
	var data []byte
	var err error
	switch p.CNS {
	case nvme.CNSController:
		data, err = c.identifyController().Marshal()
	case nvme.CNSNamespace:
		if c.discovery() {
			return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "identify namespace on a discovery controller")}
		}
		if cmd.NSID == 0 || cmd.NSID == nvme.BroadcastNSID {
			return result{err: nvme.Errorf(nvme.StatusInvalidNamespaceOrFormat.WithDNR(), "identify namespace %#x", cmd.NSID)}
		}
		n := c.sub.Namespace(cmd.NSID)
		if n == nil {
			data = make([]byte, nvme.IdentifySize) // inactive: all zero (nvmet)
			break
		}
		data, err = identifyNamespace(n).Marshal()
	case nvme.CNSActiveNamespaces:
		if c.discovery() {
			return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "namespace list on a discovery controller")}
		}
		if cmd.NSID >= 0xfffffffe {
			return result{err: nvme.Errorf(nvme.StatusInvalidNamespaceOrFormat.WithDNR(), "active namespace list after %#x", cmd.NSID)}
		}
		data = nvme.ActiveNamespaceList(c.sub.activeNSIDs(), cmd.NSID)
	case nvme.CNSNamespaceDescriptors:
		if c.discovery() {
			return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "namespace descriptors on a discovery controller")}
		}
		n := c.sub.Namespace(cmd.NSID)
		if n == nil {
			return result{err: nvme.Errorf(nvme.StatusInvalidNamespaceOrFormat.WithDNR(), "namespace %d not active", cmd.NSID)}
		}
		ids := nvme.NamespaceIDs{NGUID: n.nguid, UUID: n.uuid, HasCSI: true}
		data, err = ids.Marshal()
	default:
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "identify CNS %#x not supported", uint8(p.CNS))}
	}
	if err != nil {
		return result{err: nvme.Errorf(nvme.StatusInternalError, "identify: %w", err)}
	}
	if err := setData(r, data); err != nil {
		return result{err: err}
	}
	return result{}
}

func (c *controller) identifyController() *nvme.IdentifyController {
	t := c.t
	mdts, _ := nvme.MDTSFor(int64(t.cfg.maxTransfer), BlockSize)
	id := &nvme.IdentifyController{
		MN: modelNumber, FR: firmwareRevision, RAB: 6, CNTLID: c.id, VER: uint32(nvme.Version1_3),
		MDTS: mdts, CNTRLTYPE: nvme.ControllerTypeIO, ACL: 3, AERL: maxAERs - 1, FRMW: 0x3,
		LPA: nvme.LPACommandEffects | nvme.LPAExtendedData, KAS: 10,
		SQES: nvme.SQESFabrics, CQES: nvme.CQESFabrics, MAXCMD: uint16(t.cfg.queueDepth),
		SGLS:   c.port.sgls,
		IOCCSZ: nvme.IOCCSZFor(c.port.icd), IORCSZ: 1, MSDBD: 1,
		CMIC: nvme.CMICMultiController,
		PSD0: nvme.PowerStateDescriptor{MP: 2500},
		NP:   t.instance,
	}
	if !c.discovery() {
		id.NPToken = c.token
		id.OAES = uint32(supportedAEC)
	}
	if c.discovery() {
		id.SN = "discovery"
		id.SUBNQN = nvme.DiscoveryNQN
		id.CNTRLTYPE = nvme.ControllerTypeDiscovery
		id.IOCCSZ, id.IORCSZ, id.MAXCMD = 0, 0, 0
		id.LPA = nvme.LPAExtendedData
		return id
	}
	id.SN = c.sub.serial
	id.SUBNQN = c.sub.nqn
	id.NN = c.sub.maxNSID()
	id.MNAN = id.NN
	id.ONCS = nvme.ONCSDatasetManagement | nvme.ONCSWriteZeroes
	id.VWC = nvme.VWCPresent | nvme.VWCFlushBroadcastSupported
	return id
}

func identifyNamespace(n *Namespace) *nvme.IdentifyNamespace {
	blocks := n.Blocks()
	ns := &nvme.IdentifyNamespace{
		NSZE: blocks, NCAP: blocks, NUSE: blocks,
		NSFEAT: nvme.NSFEATThinProvisioning, NMIC: 1,
		DLFEAT: nvme.DLFEATReadZeroes | nvme.DLFEATWriteZeroesDeallocate,
		NGUID:  n.nguid,
	}
	ns.LBAF[0] = nvme.LBAFormat{LBADS: 12}
	var cap [16]byte
	le := uint64(n.Size())
	for i := 0; i < 8; i++ {
		cap[i] = byte(le >> (8 * i))
	}
	ns.NVMCAP = cap
	return ns
}

func (c *controller) getLogPage(r Request) result {
	cmd := r.Command()
	p := cmd.GetLogPage()
	length := p.Length()
	if err := cmd.CheckTransfer(length, uint64(c.t.cfg.maxTransfer)); err != nil {
		return result{err: err}
	}
	var log []byte
	switch {
	case p.LID == nvme.LogDiscovery && c.discovery():
		b, err := c.discoveryLog()
		if err != nil {
			return result{err: nvme.Errorf(nvme.StatusInternalError, "discovery log: %w", err)}
		}
		log = b
	case c.discovery():
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "log page %#x on a discovery controller", uint8(p.LID))}
	case p.LID == nvme.LogErrorInformation:
		log = make([]byte, nvme.ErrorLogEntrySize)
	case p.LID == nvme.LogSMARTHealth:
		h := nvme.NewHealthLog()
		log = h.Marshal()
	case p.LID == nvme.LogFirmwareSlot:
		fw := nvme.FirmwareSlotLog{Revisions: [7]string{firmwareRevision}}
		b, err := fw.Marshal()
		if err != nil {
			return result{err: nvme.Errorf(nvme.StatusInternalError, "firmware log: %w", err)}
		}
		log = b
	case p.LID == nvme.LogChangedNamespaces:
		log = c.changedNamespaceLog(p.RAE)
	case p.LID == nvme.LogCommandEffects:
		log = commandEffects(c.port.oneSided).Marshal()
	default:
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "log page %#x not supported", uint8(p.LID))}
	}
	out, err := nvme.SliceLog(log, p.LPO, length)
	if err != nil {
		return result{err: err}
	}
	if err := setData(r, out); err != nil {
		return result{err: err}
	}
	return result{}
}

// commandEffects lists the commands supported, NP Get Region Descriptor
// only where regions are exported (oneSided).
func commandEffects(oneSided bool) *nvme.CommandEffectsLog {
	l := &nvme.CommandEffectsLog{}
	for _, op := range []nvme.Opcode{nvme.AdminGetLogPage, nvme.AdminIdentify, nvme.AdminAbort, nvme.AdminSetFeatures,
		nvme.AdminGetFeatures, nvme.AdminAsyncEventRequest, nvme.AdminKeepAlive} {
		l.Admin[op] = nvme.EffectSupported
	}
	if oneSided {
		l.Admin[nvme.AdminNPGetRegionDescriptor] = nvme.EffectSupported
	}
	for _, op := range []nvme.Opcode{nvme.IOFlush, nvme.IORead, nvme.IONPAdvise} {
		l.IO[op] = nvme.EffectSupported
	}
	for _, op := range []nvme.Opcode{nvme.IOWrite, nvme.IOWriteZeroes, nvme.IODatasetManagement} {
		l.IO[op] = nvme.EffectSupported | nvme.EffectLBAContentChange
	}
	return l
}

func (c *controller) setFeatures(cmd *nvme.Command) result {
	f := cmd.Features()
	if f.Save {
		return result{err: nvme.Errorf(nvme.StatusFeatureNotSaveable.WithDNR(), "feature %#x cannot be saved", uint8(f.FID))}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f.FID {
	case nvme.FeatureNumberOfQueues:
		if c.discovery() {
			break
		}
		req, err := nvme.DecodeNumberOfQueues(f.Value)
		if err != nil {
			return result{err: err}
		}
		if len(c.ioQueues) > 0 {
			return result{err: nvme.Errorf(nvme.StatusCommandSequenceError, "number of queues changed while I/O queues exist")}
		}
		c.ioGrant = min(req.IOQueues(), c.t.cfg.maxIOQueues)
		v, _ := nvme.NumberOfQueues{Submission: c.ioGrant, Completion: c.ioGrant}.Encode()
		return result{dw0: v}
	case nvme.FeatureKeepAliveTimer:
		d := nvme.KeepAliveTimeout(f.Value)
		if d <= 0 {
			return result{err: nvme.Errorf(nvme.StatusKeepAliveTimeoutInvalid.WithDNR(), "keep-alive timeout of 0")}
		}
		c.kato = min(d, c.t.cfg.maxKATO)
		c.armKeepAliveLocked()
		return result{}
	case nvme.FeatureVolatileWriteCache:
		if c.discovery() {
			break
		}
		c.vwc = nvme.VolatileWriteCacheEnabled(f.Value)
		return result{}
	case nvme.FeatureAsyncEventConfig:
		if err := nvme.AsyncEventConfig(f.Value).Check(supportedAEC); err != nil {
			return result{err: err}
		}
		c.aec = f.Value
		return result{}
	}
	return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "feature %#x not supported", uint8(f.FID))}
}

func (c *controller) getFeatures(cmd *nvme.Command) result {
	f := cmd.Features()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f.FID {
	case nvme.FeatureNumberOfQueues:
		if c.discovery() {
			break
		}
		n := c.ioGrant
		if f.Select == nvme.SelectDefault || n == 0 {
			n = c.t.cfg.maxIOQueues
		}
		v, _ := nvme.NumberOfQueues{Submission: n, Completion: n}.Encode()
		return result{dw0: v}
	case nvme.FeatureKeepAliveTimer:
		return result{dw0: nvme.KeepAliveTimeoutValue(c.kato)}
	case nvme.FeatureVolatileWriteCache:
		if c.discovery() {
			break
		}
		return result{dw0: nvme.VolatileWriteCacheValue(c.vwc)}
	case nvme.FeatureAsyncEventConfig:
		return result{dw0: c.aec}
	}
	return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "feature %#x not supported", uint8(f.FID))}
}

// regionDescriptor answers NP Get Region Descriptor: where the namespace
// lives in this controller's registration of its region.
func (c *controller) regionDescriptor(r Request) result {
	cmd := r.Command()
	if err := cmd.CheckNPGetRegionDescriptor(); err != nil {
		return result{err: err}
	}
	n := c.sub.Namespace(cmd.NSID)
	if n == nil {
		return result{err: nvme.Errorf(nvme.StatusInvalidNamespaceOrFormat.WithDNR(), "namespace %d not active", cmd.NSID)}
	}
	if !n.OneSided() {
		// Invalid Field is what hosts take for "no one-sided reads here".
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(),
			"namespace %d is served two-sided only: it does not fit in the pinned memory of the baseline mode", n.nsid)}
	}
	if n.mirror != nil {
		if cmd.RegionDescriptorFormat() < nvme.RegionDescriptorFormat2 {
			return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(),
				"namespace %d is read one-sided through frames (format 2) only", n.nsid)}
		}
		d := n.mirror.descriptor(n.Size())
		b, err := d.Marshal()
		if err != nil {
			return result{err: nvme.Errorf(nvme.StatusInternalError, "region descriptor: %w", err)}
		}
		if err := setData(r, b); err != nil {
			return result{err: err}
		}
		// This host reads frames: its Reads fill them.
		c.frameReader.Store(true)
		return result{}
	}
	if !n.Pinned() && !c.t.dev.Caps().UnpinnedRegions {
		return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(),
			"namespace %d is served two-sided only on device %s", n.nsid, c.t.dev.Name())}
	}
	mr, err := c.regionMR(n)
	if err != nil {
		if n.removed.Load() {
			return result{err: nvme.Errorf(nvme.StatusInvalidNamespaceOrFormat.WithDNR(), "namespace %d removed", cmd.NSID)}
		}
		return result{err: nvme.Errorf(nvme.StatusInternalError, "register namespace %d: %w", n.nsid, err)}
	}
	d := nvme.RegionDescriptor{Format: nvme.RegionDescriptorFormat1,
		Flags: nvme.RegionRemoteRead | nvme.RegionUnpinned | nvme.RegionAdvise,
		// The registration's length, not the namespace's: a resize since
		// (ResizeNamespace) is covered by the next registration.
		PageSize: BlockSize, Address: mr.Addr(), Length: uint64(mr.Len()), RKey: mr.RKey(),
		LBASize: BlockSize, Magic: mr.Magic()}
	if n.Pinned() {
		// Every page is always there: no magic page to look for (the field
		// must still be non-zero).
		d.Flags, d.Magic = nvme.RegionRemoteRead, ^uint64(0)
	}
	b, err := d.Marshal()
	if err != nil {
		return result{err: nvme.Errorf(nvme.StatusInternalError, "region descriptor: %w", err)}
	}
	if err := setData(r, b); err != nil {
		return result{err: err}
	}
	return result{}
}

// discoveryLog lists, for each subsystem this controller's host may access,
// the I/O ports of the transport the host reached the discovery controller
// over: a host that discovers over NVMe/TCP is pointed at NVMe/TCP ports,
// one over the nprdma fabric at every fabric port (shared-memory ones
// included, for hosts on this machine).
func (c *controller) discoveryLog() ([]byte, error) {
	t := c.t
	l := nvme.DiscoveryLog{GenCtr: t.genCtr.Load()}
	for _, p := range t.ioPorts(c.port.transport) {
		for _, s := range t.Subsystems() {
			if !s.Allows(c.hostNQN) {
				continue
			}
			e := p.entry
			e.SUBTYPE, e.SubNQN = nvme.SubtypeNVM, s.nqn
			l.Entries = append(l.Entries, e)
		}
	}
	return l.Marshal()
}
