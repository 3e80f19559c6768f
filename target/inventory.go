package target

import (
	"encoding/hex"

	"github.com/nprdma/nprdma/swap"
	"github.com/nprdma/nprdma/target/manage"
)

// Inventory describes what the target serves now.
func (t *Target) Inventory() (manage.Inventory, error) {
	inv := manage.Inventory{MemoryBytes: t.cfg.manage.memory, VolumeDir: t.cfg.manage.volumeDir, Subsystems: []manage.SubsystemInfo{}}
	if inv.VolumeDir != "" {
		var err error
		if inv.CapacityBytes, _, err = t.volumeSpace(); err != nil {
			return inv, err
		}
		if inv.AvailableBytes, err = t.availableBytes(); err != nil {
			return inv, err
		}
	}
	ctrls := t.ControllerList()
	for _, s := range t.Subsystems() {
		si := manage.SubsystemInfo{NQN: s.nqn, Serial: s.serial, Managed: s.managed, AllowAnyHost: s.AllowsAnyHost(),
			Hosts: s.Hosts(), Controllers: []manage.ControllerInfo{}, Namespaces: []manage.NamespaceInfo{}}
		if si.Hosts == nil {
			si.Hosts = []string{}
		}
		for _, c := range ctrls {
			if c.Subsystem == s.nqn {
				si.Controllers = append(si.Controllers, manage.ControllerInfo{CNTLID: c.CNTLID, HostNQN: c.HostNQN, IOQueues: c.IOQueues})
			}
		}
		for _, n := range s.Namespaces() {
			ni := n.info()
			inv.ProvisionedBytes += ni.SizeBytes
			inv.MemoryBudgetedBytes += ni.BudgetBytes
			si.Namespaces = append(si.Namespaces, ni)
		}
		inv.Subsystems = append(inv.Subsystems, si)
	}
	if inv.MemoryBytes > 0 {
		inv.MemoryFreeBytes = max(inv.MemoryBytes-inv.MemoryBudgetedBytes, 0)
	}
	return inv, nil
}

func (n *Namespace) info() manage.NamespaceInfo {
	ni := manage.NamespaceInfo{Subsystem: n.sub.nqn, NSID: n.nsid, Name: n.Name(), Managed: n.Managed(), Backing: n.Backing(),
		SizeBytes: n.Size(), MaxBytes: n.Size(), NGUID: hex.EncodeToString(n.nguid[:]), UUID: n.uuid.String(),
		BudgetBytes: n.budget()}
	if n.managed != nil {
		ni.OwnsBacking = n.managed.ownsFile
	}
	if n.region != nil {
		st := n.region.Stats()
		ni.MaxBytes = n.region.MaxSize()
		ni.ResidentBytes, ni.DirtyBytes = st.Resident*swap.PageSize, st.Dirty*swap.PageSize
	}
	if ni.UsedBytes = allocatedBytes(n.Backing()); ni.UsedBytes == 0 && isBlockDevice(n.dev) {
		ni.UsedBytes = n.dev.Size()
	}
	return ni
}
