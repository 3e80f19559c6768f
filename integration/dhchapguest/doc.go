// Package dhchapguest holds the guest-lab tests of in-band authentication
// (DH-HMAC-CHAP) against the Linux kernel: the kernel's NVMe/TCP host with
// --dhchap-secret and --dhchap-ctrl-secret against nprdma-target
// --listen-nvme-tcp; nprdma-initiator --transport tcp against the kernel's
// nvmet with a configured dhchap key; and over Soft-RoCE, the kernel's
// NVMe/RDMA host and nprdma-initiator on the nprdma fabric against
// nprdma-target --provider verbs. They run in the guest lab (`make
// guest-test`); the protocol's own tests run everywhere (nvme/dhchap,
// target, initiator, cmd/nprdma-target). The package has no code of its
// own.
package dhchapguest
