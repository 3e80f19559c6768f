// Package manage is the contract of nprdma-target's management API and its
// client: JSON-RPC 2.0 requests (one per HTTP POST to /rpc) on a unix socket
// (access by file permission) or on TCP with a bearer token, methods named
// as SPDK's rpc.py names them (nvmf_create_subsystem, nvmf_subsystem_add_ns,
// ...), errors carrying a negative errno as SPDK's do. The server is the
// target's (target.ManageHandler); `nprdma-target ctl` and the CSI driver are
// clients. docs/target.md §11 describes the methods.
//
// The package imports nothing of the project, so that a client links
// neither the target nor cgo.
package manage
