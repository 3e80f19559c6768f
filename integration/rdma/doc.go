// Package rdma holds the tests of the project on real RDMA devices: Soft-RoCE
// in the guest lab (docs/lab.md), where nprdma/verbs runs its tests (the
// conformance suite among them), the kernel's own NVMe/RDMA host and target
// meet nprdma-target and nprdma-initiator over nprdma/verbs, and what the
// kernel does with registrations of a userfaultfd-paged region is measured.
// It has tests only.
package rdma
