package manage

// The methods, named as SPDK's rpc.py names its nvmf methods, with their
// params. Sizes are bytes.
const (
	// MethodGetSubsystems: no params; the result is an Inventory.
	MethodGetSubsystems = "nvmf_get_subsystems"
	// MethodCreateSubsystem: CreateSubsystemParams; a SubsystemInfo.
	MethodCreateSubsystem = "nvmf_create_subsystem"
	// MethodDeleteSubsystem: DeleteSubsystemParams; true.
	MethodDeleteSubsystem = "nvmf_delete_subsystem"
	// MethodAddHost: HostParams; true.
	MethodAddHost = "nvmf_subsystem_add_host"
	// MethodRemoveHost: HostParams (no key files); true.
	MethodRemoveHost = "nvmf_subsystem_remove_host"
	// MethodAddNamespace: AddNamespaceParams; a NamespaceInfo.
	MethodAddNamespace = "nvmf_subsystem_add_ns"
	// MethodResizeNamespace: ResizeNamespaceParams; a NamespaceInfo.
	MethodResizeNamespace = "nvmf_subsystem_resize_ns"
	// MethodRemoveNamespace: RemoveNamespaceParams; true.
	MethodRemoveNamespace = "nvmf_subsystem_remove_ns"
)

// CreateSubsystemParams creates a subsystem.
type CreateSubsystemParams struct {
	NQN          string   `json:"nqn"`
	AllowAnyHost bool     `json:"allow_any_host,omitempty"`
	Hosts        []string `json:"hosts,omitempty"`
}

// DeleteSubsystemParams deletes a subsystem that has no namespaces; with
// Force, hosts connected are disconnected instead of refusing.
type DeleteSubsystemParams struct {
	NQN   string `json:"nqn"`
	Force bool   `json:"force,omitempty"`
}

// HostParams allows (or removes) a host on a subsystem.
type HostParams struct {
	NQN  string `json:"nqn"`
	Host string `json:"host"`
	// DHCHAPKeyFile names a file with the host's DH-HMAC-CHAP secret (add
	// only): an absolute path on the target's machine, a file only its
	// owner may read; the host must then authenticate on every queue.
	DHCHAPKeyFile string `json:"dhchap_key_file,omitempty"`
	// DHCHAPCtrlKeyFile names a file with the controller's secret for the
	// host (add only, with DHCHAPKeyFile; the same rules): the target
	// proves itself with it when the host asks (bidirectional
	// authentication).
	DHCHAPCtrlKeyFile string `json:"dhchap_ctrl_key_file,omitempty"`
}

// AddNamespaceParams creates a namespace (target.NamespaceRequest).
type AddNamespaceParams struct {
	NQN  string `json:"nqn"`
	Name string `json:"name,omitempty"`
	NSID uint32 `json:"nsid,omitempty"`
	// SizeBytes: required without Backing; with it, 0 is all of it.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Backing: an existing device or file; "" creates a file in the
	// target's volume directory.
	Backing      string `json:"backing,omitempty"`
	BudgetBytes  int64  `json:"budget_bytes,omitempty"`
	MaxSizeBytes int64  `json:"max_size_bytes,omitempty"`
}

// ResizeNamespaceParams grows a namespace.
type ResizeNamespaceParams struct {
	NQN       string `json:"nqn"`
	NSID      uint32 `json:"nsid"`
	SizeBytes int64  `json:"size_bytes"`
}

// RemoveNamespaceParams deletes a namespace; with Force, hosts connected to
// its subsystem are fenced off it instead of refusing.
type RemoveNamespaceParams struct {
	NQN   string `json:"nqn"`
	NSID  uint32 `json:"nsid"`
	Force bool   `json:"force,omitempty"`
}
