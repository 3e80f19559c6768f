package manage

// Inventory is what a target serves and what it has left: its subsystems
// with their hosts, controllers and namespaces, its DRAM and the capacity
// of its volume directory. The JSON is the management API's.
type Inventory struct {
	// MemoryBytes is the DRAM of all namespaces' budgets together
	// (the target's --memory; 0: not accounted); MemoryBudgetedBytes what the
	// namespaces hold of it, MemoryFreeBytes what is left for new ones.
	MemoryBytes         int64 `json:"memory_bytes"`
	MemoryBudgetedBytes int64 `json:"memory_budgeted_bytes"`
	MemoryFreeBytes     int64 `json:"memory_free_bytes"`
	// VolumeDir is where the target creates backing files ("": it does
	// not). CapacityBytes is the size of its file system; AvailableBytes
	// what new namespaces may still take of it: the free space less what
	// the files the target created, sparse, may still claim.
	VolumeDir      string `json:"volume_dir,omitempty"`
	CapacityBytes  int64  `json:"capacity_bytes"`
	AvailableBytes int64  `json:"available_bytes"`
	// ProvisionedBytes is the size of every namespace together.
	ProvisionedBytes int64           `json:"provisioned_bytes"`
	Subsystems       []SubsystemInfo `json:"subsystems"`
}

// SubsystemInfo describes a subsystem.
type SubsystemInfo struct {
	NQN          string           `json:"nqn"`
	Serial       string           `json:"serial"`
	Managed      bool             `json:"managed"` // created through the management API
	AllowAnyHost bool             `json:"allow_any_host"`
	Hosts        []string         `json:"hosts"`
	Controllers  []ControllerInfo `json:"controllers"` // connected now
	Namespaces   []NamespaceInfo  `json:"namespaces"`
}

// NamespaceInfo describes a namespace.
type NamespaceInfo struct {
	Subsystem string `json:"subsystem"` // its NQN
	NSID      uint32 `json:"nsid"`
	Name      string `json:"name,omitempty"`
	Managed   bool   `json:"managed"` // created through the management API
	Backing   string `json:"backing"`
	// OwnsBacking: the target created the backing file and removes it with
	// the namespace.
	OwnsBacking bool   `json:"owns_backing"`
	SizeBytes   int64  `json:"size_bytes"`
	MaxBytes    int64  `json:"max_size_bytes"` // how large it may grow while served
	NGUID       string `json:"nguid"`
	UUID        string `json:"uuid"`
	// BudgetBytes is its DRAM budget; ResidentBytes and DirtyBytes what it
	// holds of it now (dirty: not yet on the backing).
	BudgetBytes   int64 `json:"budget_bytes"`
	ResidentBytes int64 `json:"resident_bytes"`
	DirtyBytes    int64 `json:"dirty_bytes"`
	// UsedBytes is what its backing file takes on its file system (a
	// sparse file: what was written); for a block device its size.
	UsedBytes int64 `json:"used_bytes"`
}

// ControllerInfo describes a controller connected to a subsystem.
type ControllerInfo struct {
	CNTLID   uint16 `json:"cntlid"`
	HostNQN  string `json:"host_nqn"`
	IOQueues int    `json:"io_queues"`
}

// Configuration is the inventory without what changes by itself while the
// target serves (free space, residency, the connected controllers): what a
// restart must bring back, and what a refused change must leave alone.
func (inv Inventory) Configuration() Inventory {
	inv.CapacityBytes, inv.AvailableBytes = 0, 0
	subs := make([]SubsystemInfo, len(inv.Subsystems))
	for i, s := range inv.Subsystems {
		s.Controllers = nil
		nss := make([]NamespaceInfo, len(s.Namespaces))
		for j, n := range s.Namespaces {
			n.ResidentBytes, n.DirtyBytes, n.UsedBytes = 0, 0, 0
			nss[j] = n
		}
		s.Namespaces = nss
		subs[i] = s
	}
	inv.Subsystems = subs
	return inv
}
